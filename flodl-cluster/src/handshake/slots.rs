//! Slots per source address, so one address cannot hold every slot (the controller's
//! handshakes; the dashboard's connections).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// How many handshakes each source address may have in progress at once.
#[derive(Debug)]
pub struct AddressSlots {
    limit: usize,
    taken: Mutex<HashMap<IpAddr, usize>>,
}

/// One address's slot, given back when dropped.
#[derive(Debug)]
pub struct AddressSlot {
    slots: Arc<AddressSlots>,
    ip: IpAddr,
}

impl AddressSlots {
    /// At most `limit` handshakes at once from each address.
    pub fn new(limit: usize) -> Arc<AddressSlots> {
        Arc::new(AddressSlots { limit, taken: Mutex::new(HashMap::new()) })
    }

    /// The limit for a world of `world` ranks: every lane of every rank may come from one host
    /// (all ranks of `fdl launch` dial from loopback), plus a few for rejoins under way.
    pub(crate) fn limit_for(world: usize) -> usize {
        world.saturating_mul(2).saturating_add(8)
    }

    /// A slot for `ip`, or `None` when its handshakes in progress are at the limit.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        let count = taken.entry(ip).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(AddressSlot { slots: self.clone(), ip })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut taken = self.slots.taken.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = taken.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                taken.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_address_has_its_own_limit() {
        let slots = AddressSlots::new(2);
        let (a, b): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        let first = slots.take(a);
        let second = slots.take(a);
        assert!(first.is_some() && second.is_some());
        assert!(slots.take(a).is_none(), "a third from one address");
        assert!(slots.take(b).is_some(), "another address is not held up");
        drop(first);
        assert!(slots.take(a).is_some(), "a slot given back is free again");
        drop(second);
        assert!(slots.taken.lock().map(|t| t.len()).unwrap_or(9) <= 1);
    }
}
