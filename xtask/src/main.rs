//! `cargo xtask`: project automation.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("xtask: no commands yet")
}
