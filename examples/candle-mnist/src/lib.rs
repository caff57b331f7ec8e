//! The worked case of "bring your own stack": a LeNet-5-style CNN written with candle
//! (candle-core and candle-nn, CPU), trained on MNIST across flodl-ddp's ranks two ways, and
//! candle's own single-process loop beside them.
//!
//! - [`cooperative`]: the cooperative tier. Each rank is a [`flodl_ddp::Worker`] driven by a
//!   plain candle loop ([`flodl_candle::train_loop`]: forward, `backward`, AdamW); the runtime
//!   reads and writes the candle `Var`s through [`flodl_candle::CandleParams`] only when a
//!   reduce needs them.
//! - [`replica`]: the `Replica` tier. [`flodl_candle::CandleReplica`] adapts the same model to
//!   [`flodl_ddp::Replica`]; its parameters cross between candle `Var`s and flodl tensors only at
//!   reduces ([`Replica::export_parameters`](flodl_ddp::Replica::export_parameters) and
//!   [`import_parameters`](flodl_ddp::Replica::import_parameters)).
//!
//! The adapter is shared with the candle transformer ([`flodl_candle::gpt`]): [`lenet::LeNet`]
//! implements [`flodl_candle::CandleModel`], and both tiers drive it through flodl-candle.
//! - [`baseline`]: candle's own loop on one process with a chosen number of threads, and the
//!   ceiling of any data-parallel scheme (independent candle loops side by side): the
//!   throughput references.
//!
//! `cargo run --release -p flodl-candle-mnist -- --help` lists the runs.

pub mod baseline;
pub mod cooperative;
pub mod cpu;
pub mod data;
pub mod lenet;
pub mod replica;
pub mod settings;
