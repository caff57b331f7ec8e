//! flodl-nccl (being built; see ARCHITECTURE.md).
