//! flodl-tensor (being built; see ARCHITECTURE.md).
