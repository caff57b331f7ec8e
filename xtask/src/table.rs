//! A plain-text table with aligned columns, for terminal summaries.

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    /// Padded on the right.
    Left,
    /// Padded on the left (numbers).
    Right,
}

/// A table of text cells under a header row.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    columns: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and alignments.
    pub(crate) fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            columns: columns.iter().map(|(name, align)| (name.to_string(), *align)).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; missing cells are blank and extra cells are dropped.
    pub(crate) fn push(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.columns.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text: a header, a rule, and one line per row, without trailing spaces.
    pub(crate) fn render(&self) -> String {
        let widths: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, (name, _))| {
                self.rows
                    .iter()
                    .map(|row| row[i].chars().count())
                    .fold(name.chars().count(), usize::max)
            })
            .collect();
        let mut text = String::new();
        let header: Vec<String> = self.columns.iter().map(|(name, _)| name.clone()).collect();
        self.render_line(&mut text, &header, &widths);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        self.render_line(&mut text, &rule, &widths);
        for row in &self.rows {
            self.render_line(&mut text, row, &widths);
        }
        text
    }

    fn render_line(&self, text: &mut String, cells: &[String], widths: &[usize]) {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(widths[i] - cell.chars().count());
            match self.columns[i].1 {
                Align::Left => {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
                Align::Right => {
                    line.push_str(&pad);
                    line.push_str(cell);
                }
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_the_widest_cell() {
        let mut table = Table::new(&[("case", Align::Left), ("time", Align::Right)]);
        table.push(vec!["tensor kernels".into(), "1.2 s".into()]);
        table.push(vec!["nccl".into(), "12.5 s".into()]);
        table.push(vec!["short".into()]);
        let want = "\
case              time
--------------  ------
tensor kernels   1.2 s
nccl            12.5 s
short
";
        assert_eq!(table.render(), want);
    }

    #[test]
    fn the_last_column_starts_at_the_same_offset_on_every_line() {
        let cells = ["a", "bbbbbbb", "", "ccc", "dd"];
        for n in 1..=cells.len() {
            let mut table =
                Table::new(&[("x", Align::Left), ("y", Align::Right), ("z", Align::Left)]);
            for (i, cell) in cells[..n].iter().enumerate() {
                table.push(vec![cells[n - 1 - i].into(), (*cell).into(), "z".into()]);
            }
            let text = table.render();
            // The last column is one character wide, so aligned lines all have the same length.
            let lengths: Vec<usize> = text.lines().map(|line| line.chars().count()).collect();
            assert!(lengths.windows(2).all(|w| w[0] == w[1]), "{text}");
        }
    }
}
