//! flodl-ddp (being built; see ARCHITECTURE.md).
