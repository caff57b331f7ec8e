//! Why the controller turns a joiner away, phrased for either side.

use std::fmt::Write;

use crate::session::Lane;
use crate::wire::LaneHello;

/// A reason to refuse a joining connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The joiner speaks another protocol version.
    Protocol { joiner: u32, controller: u32 },
    /// The joiner's application speaks another version of its messages.
    App { joiner: u32, controller: u32 },
    /// The joiner's run specification hashes differently.
    Run { joiner: [u8; 32], controller: [u8; 32] },
    /// The joiner was launched with another world size.
    World { joiner: usize, controller: usize },
    /// The joiner's rank is not below the world size.
    Rank { rank: usize, world: usize },
    /// The rank already has a running session.
    Connected { rank: usize },
    /// The rank is already being joined by another process.
    Joining { rank: usize },
    /// The same lane of one join arrived twice.
    LaneTwice { rank: usize, lane: Lane },
    /// The first message was not a hello.
    NotHello,
    /// The hello claims a rank its certificate was not issued for.
    Seat { claimed: usize, certified: String },
}

/// Whose view a refusal line takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// The joining process ("this process").
    Joiner,
    /// The controller ("this controller").
    Controller,
}

impl Refusal {
    /// The reasons a hello alone can be refused for, without looking at other sessions.
    /// `ours`: the controller's protocol and application protocol.
    pub(crate) fn check(
        lane_hello: &LaneHello,
        ours: (u32, u32),
        run: &[u8; 32],
        world: usize,
    ) -> Option<Refusal> {
        let (protocol, app) = ours;
        let hello = &lane_hello.hello;
        if hello.protocol != protocol {
            return Some(Refusal::Protocol { joiner: hello.protocol, controller: protocol });
        }
        if lane_hello.app != app {
            return Some(Refusal::App { joiner: lane_hello.app, controller: app });
        }
        if hello.run != *run {
            return Some(Refusal::Run { joiner: hello.run, controller: *run });
        }
        if hello.world != world {
            return Some(Refusal::World { joiner: hello.world, controller: world });
        }
        if hello.rank >= world {
            return Some(Refusal::Rank { rank: hello.rank, world });
        }
        None
    }

    /// One line saying why, from one side's view.
    pub(crate) fn line(&self, view: View) -> String {
        let (me, other) = match view {
            View::Joiner => ("this process", "the controller"),
            View::Controller => ("the joiner", "this controller"),
        };
        match self {
            Refusal::Protocol { joiner, controller } => {
                format!(
                    "protocol differs: {me} speaks version {joiner}, {other} version {controller}"
                )
            }
            Refusal::App { joiner, controller } => {
                format!(
                    "the application's protocol differs: {me} speaks version {joiner}, {other} \
                     version {controller} (every process of a job must run the same release)"
                )
            }
            Refusal::Run { joiner, controller } => {
                format!(
                    "run specification differs (its settings, or the checksums of the training \
                     and test data the process loaded): {me} {}, {other} {}",
                    short(joiner),
                    short(controller)
                )
            }
            Refusal::World { joiner, controller } => {
                format!(
                    "world size differs: {me} was launched with {joiner} ranks, {other} with {controller}"
                )
            }
            Refusal::Rank { rank, world } => {
                format!("rank {rank} is out of range for a world of {world} ranks")
            }
            Refusal::Connected { rank } => format!("rank {rank} is already connected"),
            Refusal::Joining { rank } => {
                format!("rank {rank} is already joining from another connection")
            }
            Refusal::LaneTwice { rank, lane } => {
                format!("rank {rank} opened its {lane} lane twice")
            }
            Refusal::NotHello => "the first message was not a hello".into(),
            Refusal::Seat { claimed, certified } => {
                format!("{me} claims rank {claimed} but its certificate is {certified}'s")
            }
        }
    }
}

/// The rank a joiner's refusal line says another live process holds (a session running, or
/// another join under way), read back from the phrasing of [`Refusal::line`].
pub(crate) fn taken_rank(line: &str) -> Option<usize> {
    let rest = line.strip_prefix("rank ")?;
    let (rank, tail) = rest.split_once(' ')?;
    let taken =
        tail == "is already connected" || tail == "is already joining from another connection";
    taken.then(|| rank.parse().ok()).flatten()
}

/// The first bytes of a hash in hex, enough to tell two apart.
fn short(hash: &[u8; 32]) -> String {
    let mut out = String::with_capacity(9);
    for byte in &hash[..4] {
        let _ = write!(out, "{byte:02x}");
    }
    out.push('…');
    out
}
