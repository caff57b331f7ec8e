//! The kernels: each one function with one meaning, running on the stream it is given.
//!
//! Every kernel checks devices (all tensors on the stream's device), dtypes and shapes first and
//! returns a typed [`Error`](crate::Error) before touching any data. On the CPU the work is done
//! when the call returns; on CUDA it is queued on the stream (functions returning a host value
//! wait for it).

mod check;
mod elementwise;
mod linalg;
mod loss;
mod norm;
mod optim;
mod quant;

pub use elementwise::{axpy, cast, fill, lerp, relu, relu_backward, scale, weighted_sum};
pub use linalg::{Transpose, bias_add, gemm, sum_rows};
pub use loss::{argmax_correct, log_softmax_nll};
pub use norm::{clip_global_norm, dot, global_l2_norm, l2_norm, l2_norm_diff};
pub use optim::{adam_step, sgd_step};
pub use quant::{dequantize, quantize, quantize_with_feedback};
