//! Inline SVG bar charts for the bench dashboard.

/// One bar: a labelled value, an optional reference mark (the baseline), and its caption.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bar {
    /// The text left of the bar.
    pub(crate) label: String,
    /// The bar's length, in the chart's unit.
    pub(crate) value: f64,
    /// Where a tick marks the baseline, in the same unit.
    pub(crate) reference: Option<f64>,
    /// The text right of the bar (the value with its unit).
    pub(crate) caption: String,
    /// Drawn in the regression colour.
    pub(crate) flagged: bool,
}

const WIDTH: f64 = 820.0;
const LABEL_WIDTH: f64 = 320.0;
const BAR_SPACE: f64 = 360.0;
const ROW: f64 = 22.0;
const TOP: f64 = 30.0;

/// A horizontal bar chart titled `title`, as a standalone `<svg>` element.
pub(crate) fn bar_chart(title: &str, bars: &[Bar]) -> String {
    let max = bars
        .iter()
        .flat_map(|b| std::iter::once(b.value).chain(b.reference))
        .fold(0.0_f64, f64::max);
    let scale = if max > 0.0 { BAR_SPACE / max } else { 0.0 };
    let height = TOP + ROW * bars.len() as f64 + 10.0;
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{title}">"#,
        title = escape(title)
    );
    svg.push_str(&format!(r#"<text x="0" y="18" class="title">{}</text>"#, escape(title)));
    for (i, bar) in bars.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        let length = (bar.value.max(0.0) * scale).max(1.0);
        let class = if bar.flagged { "bar flagged" } else { "bar" };
        svg.push_str(&format!(
            r#"<text x="{x}" y="{ty}" text-anchor="end">{label}</text><rect class="{class}" x="{bx}" y="{y}" width="{length:.1}" height="{h}"/><text x="{cx:.1}" y="{ty}">{caption}</text>"#,
            x = LABEL_WIDTH - 8.0,
            ty = y + 15.0,
            label = escape(&bar.label),
            bx = LABEL_WIDTH,
            h = ROW - 6.0,
            cx = LABEL_WIDTH + length + 6.0,
            caption = escape(&bar.caption),
        ));
        if let Some(reference) = bar.reference {
            let x = LABEL_WIDTH + reference.max(0.0) * scale;
            svg.push_str(&format!(
                r#"<line class="reference" x1="{x:.1}" x2="{x:.1}" y1="{y1}" y2="{y2}"><title>baseline</title></line>"#,
                y1 = y - 2.0,
                y2 = y + ROW - 4.0
            ));
        }
    }
    svg.push_str("</svg>");
    svg
}

/// `text` with the five XML special characters escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widths(svg: &str) -> Vec<f64> {
        svg.split("<rect ")
            .skip(1)
            .filter_map(|rect| rect.split("width=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    }

    #[test]
    fn bars_scale_to_the_largest_value_or_reference() {
        let bar = |label: &str, value: f64, reference: Option<f64>| Bar {
            label: label.into(),
            value,
            reference,
            caption: format!("{value} GB/s"),
            flagged: value < 2.0,
        };
        let cases = [
            (vec![bar("a", 1.0, None), bar("b", 4.0, None)], vec![90.0, 360.0]),
            (vec![bar("a", 1.0, Some(8.0)), bar("b", 4.0, None)], vec![45.0, 180.0]),
            (vec![bar("a", 0.0, None)], vec![1.0]),
        ];
        for (bars, want) in cases {
            let svg = bar_chart("kernels <GB/s>", &bars);
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
            assert!(svg.contains("kernels &lt;GB/s&gt;"));
            assert_eq!(widths(&svg), want);
            assert_eq!(
                svg.matches("class=\"reference\"").count(),
                bars.iter().filter(|b| b.reference.is_some()).count()
            );
            assert_eq!(
                svg.matches("bar flagged").count(),
                bars.iter().filter(|b| b.flagged).count()
            );
        }
    }

    #[test]
    fn escaping_covers_markup() {
        assert_eq!(escape(r#"a<b>&"c"'d'"#), "a&lt;b&gt;&amp;&quot;c&quot;&#39;d&#39;");
        assert_eq!(escape("cuda0_gemm@flop"), "cuda0_gemm@flop");
    }
}
