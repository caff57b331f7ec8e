//! Integration tests of the cluster control plane, all over loopback or in-memory pipes, each
//! bounded in time.

mod support;

mod decode;
mod fuzz;
mod hello;
mod identity;
mod intruders;
mod liveness;
mod order;
mod seats;
mod session;
mod simulated;
