//! The first host of a Slurm host list in its compressed form (`gpu[03-05,09],cpu1`).

/// The first host named by a Slurm host list such as `gpu[03-05,09],cpu1` (`gpu03`) or
/// `rack[1-2]-n[07,09]` (`rack1-n07`); an error says what is wrong with the list.
pub fn first_host(list: &str) -> Result<String, &'static str> {
    let list = list.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0usize;
    let mut end = list.len();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or("a ']' without its '['")?,
            ',' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let entry = &list[..end];
    if entry.is_empty() {
        return Err("the list is empty");
    }
    // Each bracketed range set becomes its first value, as written (zero padding kept).
    let mut host = String::new();
    let mut rest = entry;
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let close = rest[open..].find(']').ok_or("a '[' without its ']'")? + open;
        let set = &rest[open + 1..close];
        if set.contains('[') {
            return Err("nested brackets");
        }
        let first = set.split(',').next().unwrap_or("");
        let low = first.split('-').next().unwrap_or("").trim();
        if low.is_empty() || !low.bytes().all(|b| b.is_ascii_digit()) {
            return Err("a bracket holds something other than numbers and ranges");
        }
        host.push_str(low);
        rest = &rest[close + 1..];
    }
    if rest.contains(']') {
        return Err("a ']' without its '['");
    }
    host.push_str(rest);
    Ok(host)
}
