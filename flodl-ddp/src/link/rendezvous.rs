//! How a cluster run's processes meet: the controller accepts a connection from every other
//! rank, each other rank connects to the controller; both sides prove they run the same run
//! (`run`, the spec's hash). Two flavors, a closed set: in-memory connections within one
//! process ([`Memory`]) and mutual TLS through flodl-cluster ([`TlsRendezvous`]).

use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use crate::link::frames::{Admitted, Frames, admitted};
use crate::link::memory::Memory;
#[cfg(feature = "cluster")]
use crate::link::tls::TlsRendezvous;

/// A cluster run's way to meet, one of its flavors.
pub(crate) struct Rendezvous {
    flavor: Flavor,
}

/// The flavors of a rendezvous.
enum Flavor {
    /// In-memory connections, shared by the places of one process.
    Memory(Memory),
    /// Mutual TLS.
    #[cfg(feature = "cluster")]
    Tls(TlsRendezvous),
}

impl Rendezvous {
    /// In-memory connections for a world of `world` ranks in this process.
    pub(crate) fn in_memory(world: usize) -> Rendezvous {
        Rendezvous { flavor: Flavor::Memory(Memory::new(world)) }
    }

    /// Over mutual TLS.
    #[cfg(feature = "cluster")]
    pub(crate) fn tls(tls: TlsRendezvous) -> Rendezvous {
        Rendezvous { flavor: Flavor::Tls(tls) }
    }

    /// The TLS flavor's settings, when it is TLS (for rebuilding it with other options).
    #[cfg(feature = "cluster")]
    pub(crate) fn as_tls(&self) -> Option<&TlsRendezvous> {
        match &self.flavor {
            Flavor::Tls(tls) => Some(tls),
            Flavor::Memory(_) => None,
        }
    }

    /// Whether the ranks that meet through it are threads of this process on in-memory
    /// connections (otherwise: processes of their own).
    pub(crate) fn is_in_memory(&self) -> bool {
        matches!(self.flavor, Flavor::Memory(_))
    }

    /// Controller: a connection from each rank of `ranks` (the ranks in other processes),
    /// within `wait` (or from enough of them that `quorum` ranks, this process's included,
    /// take part), and the ranks that join again later (the rendezvous keeps admitting until
    /// those are dropped). A connection silent for `silence` ends.
    ///
    /// # Errors
    /// [`crate::Error::RanksMissing`] naming the ranks that did not join in time; the
    /// transport's errors.
    pub(crate) fn accept(
        &self,
        run: [u8; 32],
        world: usize,
        ranks: &[usize],
        quorum: usize,
        wait: Duration,
        silence: Duration,
    ) -> Result<Admitted> {
        match &self.flavor {
            Flavor::Memory(m) => m.accept(run, world, ranks, quorum, wait, silence).map(admitted),
            #[cfg(feature = "cluster")]
            Flavor::Tls(t) => t.accept(run, world, ranks, quorum, wait, silence).map(admitted),
        }
    }

    /// Rank `rank`: its connection to the controller, within `wait`.
    ///
    /// # Errors
    /// The transport's errors (a refusal says why).
    pub(crate) fn join(
        &self,
        run: [u8; 32],
        rank: usize,
        world: usize,
        wait: Duration,
        silence: Duration,
    ) -> Result<Arc<Frames>> {
        let frames: Frames = match &self.flavor {
            Flavor::Memory(m) => m.join(run, rank, world, wait, silence)?.into(),
            #[cfg(feature = "cluster")]
            Flavor::Tls(t) => t.join(run, rank, world, wait, silence)?.into(),
        };
        Ok(Arc::new(frames))
    }
}
