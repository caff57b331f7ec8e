//! A controller's term: which controller of the run a message comes from. It only grows; a
//! process obeys the highest term it has seen and refuses a message of a lower one, so two
//! controllers can never both be obeyed by the same process.

use serde::{Deserialize, Serialize};

/// The number of controllers the run had before the one that speaks: 0 for the first, one more
/// at each takeover.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub(crate) struct Term(pub(crate) u64);

impl Term {
    /// The term of the controller that takes over from this one.
    pub(crate) fn next(self) -> Term {
        Term(self.0.saturating_add(1))
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A message of an older controller than the one this process obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a message of term {got} refused: this process obeys term {current}")]
pub(crate) struct StaleTerm {
    /// The message's term.
    pub(crate) got: Term,
    /// The term obeyed.
    pub(crate) current: Term,
}

/// The highest term a process has obeyed: the one rule for whether a message's term is heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TermGate {
    current: Term,
}

impl TermGate {
    /// A gate obeying `current`.
    pub(crate) fn new(current: Term) -> TermGate {
        TermGate { current }
    }

    /// The term obeyed.
    pub(crate) fn current(&self) -> Term {
        self.current
    }

    /// Hears a message of `term`: refused when older than the term obeyed; a newer term (a
    /// controller that took over) is obeyed from now on, and the older one never again.
    ///
    /// # Errors
    /// [`StaleTerm`] for a term below the one obeyed.
    pub(crate) fn admit(&mut self, term: Term) -> Result<(), StaleTerm> {
        if term < self.current {
            return Err(StaleTerm { got: term, current: self.current });
        }
        self.current = term;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    /// Random sequences of terms against the reference (the running maximum): a term is heard
    /// exactly when it is at least every term heard before it, and the gate's term never goes
    /// back.
    #[test]
    fn a_term_below_the_highest_heard_is_refused() -> Result<(), String> {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(31);
        for case in 0..200 {
            let mut gate = TermGate::new(Term(0));
            let mut highest = 0u64;
            for i in 0..100 {
                let term = rng.random_range(0..8u64);
                let heard = gate.admit(Term(term)).is_ok();
                if heard != (term >= highest) {
                    return Err(format!(
                        "case {case}, message {i}: term {term} heard {heard}, highest {highest}"
                    ));
                }
                highest = highest.max(term);
                // A takeover: the next controller's term is heard, the old one never again.
                if rng.random_bool(0.05) {
                    let next = gate.current().next();
                    if gate.admit(next).is_err() || gate.admit(Term(highest)).is_ok() {
                        return Err(format!("case {case}: takeover to {next} not obeyed"));
                    }
                    highest = next.0;
                }
                if gate.current() != Term(highest) {
                    return Err(format!(
                        "case {case}: gate at {}, highest {highest}",
                        gate.current()
                    ));
                }
            }
        }
        Ok(())
    }
}
