//! `fdl`: the flodl command line.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("fdl: no commands yet")
}
