//! flodl-data (being built; see ARCHITECTURE.md).
