//! Integration tests of the cluster control plane, all over loopback or in-memory pipes, each
//! bounded in time.

mod support;

mod identity;
mod intruders;
mod session;
