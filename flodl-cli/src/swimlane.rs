//! The report's swimlane: what each rank was doing over the run, as one lane per rank.
//!
//! Each epoch is a stretch of the time axis (from the previous epoch's end to its own); in it,
//! a rank's lane is split between the activities of its breakdown for that epoch, in
//! proportion to their milliseconds, in [`Activity::ALL`]'s order. The reduces are ticks above
//! the lanes.

use std::fmt::Write as _;

use flodl_ddp::{Activity, EpochMetrics};

use crate::chart::{Axis, escape};

const WIDTH: f64 = 1124.0;
const MARGIN_LEFT: f64 = 110.0;
const MARGIN_RIGHT: f64 = 16.0;
const MARGIN_TOP: f64 = 40.0;
const LANE: f64 = 26.0;
const GAP: f64 = 6.0;
const BOTTOM: f64 = 62.0;

/// The colour of an activity (compute green, waiting grey, the losses warm).
pub(crate) fn colour(activity: Activity) -> &'static str {
    match activity {
        Activity::Compute => "#009e73",
        Activity::Data => "#e69f00",
        Activity::Reduce => "#0072b2",
        Activity::Exchange => "#004d7a",
        Activity::Waiting => "#bbbbbb",
        Activity::Evaluation => "#cc79a7",
        Activity::Checkpoint => "#56b4e9",
        Activity::Other => "#d55e00",
    }
}

/// The swimlane of a run: `epochs` as (end in seconds since training started, metrics),
/// `reduces` as their completion times in seconds, `names` the lanes' labels by rank.
pub(crate) fn swimlane(
    epochs: &[(f64, &EpochMetrics)],
    reduces: &[f64],
    names: &[String],
) -> String {
    let world = names.len().max(epochs.iter().map(|(_, e)| e.ranks.len()).max().unwrap_or(0));
    let height = MARGIN_TOP + world as f64 * (LANE + GAP) + BOTTOM;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" font-family="sans-serif" font-size="11"><title>Rank activity</title><rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/><text x="{}" y="18" text-anchor="middle" font-size="14" font-weight="bold">Rank activity</text>"##,
        WIDTH / 2.0
    );
    let end = epochs.iter().map(|(t, _)| *t).fold(0.0, f64::max);
    if world == 0 || end <= 0.0 {
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#777777">no data</text></svg>"##,
            WIDTH / 2.0,
            height / 2.0
        );
        return svg;
    }
    let axis = Axis::new(0.0, end);
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let px = |x: f64| MARGIN_LEFT + (x - axis.lo) / (axis.hi - axis.lo) * plot_w;
    let lane_y = |r: usize| MARGIN_TOP + r as f64 * (LANE + GAP);
    let bottom = lane_y(world);

    for r in 0..world {
        let name = names.get(r).cloned().unwrap_or_else(|| format!("rank {r}"));
        let _ = write!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            MARGIN_LEFT - 6.0,
            lane_y(r) + LANE / 2.0,
            escape(&name)
        );
    }
    svg.push_str(r#"<g class="lanes">"#);
    let mut start = 0.0;
    for (t_end, e) in epochs {
        let (from, to) = (start, t_end.max(start));
        start = to;
        for rank in &e.ranks {
            let wall = rank.time.wall_ms();
            if wall <= 0.0 {
                continue;
            }
            let mut x = px(from);
            let span = px(to) - px(from);
            for a in Activity::ALL {
                let w = span * rank.time.get(a) / wall;
                if w <= 0.0 {
                    continue;
                }
                let _ = write!(
                    svg,
                    r#"<rect x="{x:.2}" y="{:.1}" width="{w:.2}" height="{LANE}" fill="{}"><title>rank {} epoch {}: {} {:.0} ms</title></rect>"#,
                    lane_y(rank.rank),
                    colour(a),
                    rank.rank,
                    e.epoch + 1,
                    a,
                    rank.time.get(a)
                );
                x += w;
            }
        }
    }
    svg.push_str("</g>");
    svg.push_str(r##"<g class="reduces" stroke="#333333" stroke-width="1">"##);
    for &t in reduces.iter().filter(|t| t.is_finite() && **t >= 0.0 && **t <= end) {
        let _ = write!(
            svg,
            r#"<line x1="{0:.2}" y1="{1}" x2="{0:.2}" y2="{2}"/>"#,
            px(t),
            MARGIN_TOP - 8.0,
            MARGIN_TOP - 2.0
        );
    }
    svg.push_str("</g>");
    svg.push_str(r##"<g class="ticks" stroke="#333333">"##);
    let _ = write!(
        svg,
        r#"<line x1="{MARGIN_LEFT}" y1="{bottom}" x2="{}" y2="{bottom}"/>"#,
        MARGIN_LEFT + plot_w
    );
    for &t in &axis.ticks {
        let _ = write!(
            svg,
            r#"<text x="{:.2}" y="{}" text-anchor="middle" stroke="none">{}</text>"#,
            px(t),
            bottom + 14.0,
            axis.label(t)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" stroke="none">wall time (s); ticks above: reduces</text></g>"#,
        MARGIN_LEFT + plot_w / 2.0,
        bottom + 30.0
    );
    svg.push_str(r#"<g class="legend">"#);
    let mut lx = MARGIN_LEFT;
    let ly = height - 10.0;
    for a in Activity::ALL {
        let _ = write!(
            svg,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="10" fill="{}"/><text x="{:.1}" y="{ly:.1}">{a}</text>"#,
            ly - 9.0,
            colour(a),
            lx + 16.0
        );
        lx += 28.0 + 6.5 * a.name().len() as f64;
    }
    svg.push_str("</g></svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use flodl_ddp::{RankEpochMetrics, TimeBreakdown};

    fn epoch(e: usize, parts: &[[f64; 2]]) -> EpochMetrics {
        let ranks = parts
            .iter()
            .enumerate()
            .map(|(rank, [compute, data])| {
                let mut time = TimeBreakdown::default();
                time.add(Activity::Compute, *compute);
                time.add(Activity::Data, *data);
                RankEpochMetrics {
                    rank,
                    device: "cpu".into(),
                    batches: 1,
                    samples: 1,
                    avg_loss: 1.0,
                    compute_ms: *compute,
                    throughput: 1.0,
                    batch_share: 0.5,
                    time,
                    data_starve_ms: 0.0,
                    cache: None,
                    hit_ratio: None,
                }
            })
            .collect();
        EpochMetrics {
            epoch: e,
            avg_loss: 1.0,
            epoch_ms: 1000.0,
            samples: 2,
            throughput: 2.0,
            ranks,
            scalars: Default::default(),
            reduces: 1,
            sync_ms: 1.0,
            eval: None,
            at_ms: 0.0,
        }
    }

    /// One rectangle per rank, epoch and activity with time; their widths fill each epoch's
    /// stretch; one tick per reduce inside the run.
    #[test]
    fn lanes_fill_each_epoch_in_proportion() -> Result<(), String> {
        let (a, b) =
            (epoch(0, &[[750.0, 250.0], [1000.0, 0.0]]), epoch(1, &[[500.0, 500.0], [0.0, 0.0]]));
        let epochs = [(1.0, &a), (2.0, &b)];
        let names = vec!["rank 0 <cpu>".to_owned(), "rank 1".to_owned()];
        let svg = swimlane(&epochs, &[0.5, 1.5, 9.0], &names);
        let rects: Vec<&str> =
            svg.split("<rect x=").skip(1).filter(|r| r.contains("<title>rank")).collect();
        if rects.len() != 5 || svg.matches("<line x1").count() != 3 || !svg.contains("&lt;cpu&gt;")
        {
            return Err(svg);
        }
        let width = |r: &str| -> f64 {
            r.split("width=\"")
                .nth(1)
                .and_then(|w| w.split('"').next())
                .and_then(|w| w.parse().ok())
                .unwrap_or(-1.0)
        };
        // Epoch 1, rank 0: 3/4 compute and 1/4 data of the same stretch.
        if (width(rects[0]) - 3.0 * width(rects[1])).abs() > 0.05 {
            return Err(format!("{} vs {}", width(rects[0]), width(rects[1])));
        }
        if swimlane(&[], &[], &[]).contains("<rect x=\"1")
            || !swimlane(&[], &[], &names).contains("no data")
        {
            return Err("an empty run draws lanes".into());
        }
        Ok(())
    }
}
