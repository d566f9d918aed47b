//! Checks that a plot file the sweep wrote is what its extension says and has content.

use std::path::Path;

/// The PNG signature and an IHDR chunk with non-zero width and height.
pub fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 1000,
        "{} is only {} bytes",
        path.display(),
        bytes.len()
    );
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        path.display()
    );
    assert_eq!(
        &bytes[12..16],
        b"IHDR",
        "{}: no IHDR chunk first",
        path.display()
    );
    let w = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    let h = u32::from_be_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
    assert!(w > 0 && h > 0, "{}: {w}x{h}", path.display());
}

/// An `<svg ...>` root element, closed at the end, with text and lines in it.
pub fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let body = text.trim_start();
    let body = match body.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map_or("", |(_, r)| r).trim_start(),
        None => body,
    };
    assert!(
        body.starts_with("<svg"),
        "{}: root is not <svg",
        path.display()
    );
    assert!(
        text.trim_end().ends_with("</svg>"),
        "{}: not closed",
        path.display()
    );
    assert!(
        text.contains("<text") && text.contains("<polyline"),
        "{}: no text or lines",
        path.display()
    );
}
