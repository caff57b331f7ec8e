//! A GPT-style byte-level language model in candle: pre-norm decoder blocks with causal
//! self-attention, learned positions and an output layer tied to the token embedding.

mod config;
mod model;

pub use config::{GPT_ANCHOR, GptConfig, GptSize, gpt_elche, gpt_optim, gpt_schedule};
pub use model::Gpt;
