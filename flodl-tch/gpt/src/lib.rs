//! A GPT-style byte-level transformer written with tch (libtorch), trained by flodl-ddp on the
//! Shakespeare corpus vendored with flodl: the libtorch half of issue 28's "real model".
//!
//! - [`config`]: the sizes ([`config::Size`]: tiny ~0.83M parameters for tests, default ~6.4M,
//!   large ~25.4M; the candle transformer's shapes).
//! - [`model`]: the transformer ([`model::Gpt`], a [`flodl_tch::Model`]).
//! - [`train`]: a run through [`flodl_tch::TchReplica`] on CPU ranks (AdamW, warmup and cosine
//!   decay, gradient clipping), evaluated on held-out plays against the unigram-entropy bound.

pub mod config;
pub mod model;
pub mod train;
