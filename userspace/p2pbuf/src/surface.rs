//! 2D surfaces: a dma-buf that holds an image (width, height, DRM fourcc format and modifier,
//! stride), as display, camera and video pipelines (and the picoevb demo) move them.
//!
//! A [`Surface`] computes its layout (plane offsets and strides, total size) from its
//! description, with validation and overflow checks, and has a compact text form that fits
//! the dma-buf name (`DMA_BUF_SET_NAME`, at most 31 bytes), so that any process holding the
//! buffer sees the description in `/proc/PID/fdinfo/FD` (`name:`) and can parse it back:
//!
//! ```text
//! s:1920x1080.XR24.7680.L
//! s:<width>x<height>.<fourcc>.<stride of plane 0>.<modifier: L linear, X/Y Intel X/Y tiling>
//! ```
//!
//! Formats are [`DrmFourcc`] codes (the `drm-fourcc` crate); the layout is known for the
//! packed RGB formats, packed 4:2:2 YUV, and the 2- and 3-plane YUV formats in [`FORMATS`].
//! Modifiers are [`DrmModifier`]s; the layout is computed for `LINEAR` and for Intel's X and
//! Y tiling (tiles of 512x8 and 128x32 bytes), the others are refused because their layout
//! is vendor-private.

use std::fmt;

pub use drm_fourcc::{DrmFourcc, DrmModifier};
use serde::Serialize;

use crate::error::{Error, Result};

/// Largest width or height accepted (keeps the name form within 31 bytes; no display or
/// camera engine goes beyond it).
pub const MAX_DIM: u32 = 65535;

/// Maximum length of a dma-buf name without its NUL (`DMA_BUF_NAME_LEN` - 1,
/// `include/uapi/linux/dma-buf.h`).
pub const NAME_MAX: usize = 31;

/// Prefix of the name form.
pub const NAME_PREFIX: &str = "s:";

/// Default stride alignment of linear surfaces, in bytes (what GPUs and DMA engines commonly
/// require).
pub const LINEAR_STRIDE_ALIGN: u32 = 64;

/// One plane of a format: `bytes` per block of `block_w` pixels of this plane, and the plane's
/// horizontal and vertical subsampling relative to the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneFormat {
    /// Bytes per block.
    pub bytes: u32,
    /// Pixels (of this plane) per block.
    pub block_w: u32,
    /// Horizontal subsampling.
    pub hsub: u32,
    /// Vertical subsampling.
    pub vsub: u32,
}

const fn p(bytes: u32, block_w: u32, hsub: u32, vsub: u32) -> PlaneFormat {
    PlaneFormat {
        bytes,
        block_w,
        hsub,
        vsub,
    }
}

/// The formats whose layout this module knows: the fourcc, its name, its planes.
pub const FORMATS: &[(DrmFourcc, &str, &[PlaneFormat])] = &[
    (DrmFourcc::Xrgb8888, "XRGB8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Argb8888, "ARGB8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Xbgr8888, "XBGR8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Abgr8888, "ABGR8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Rgbx8888, "RGBX8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Bgrx8888, "BGRX8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Rgba8888, "RGBA8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Bgra8888, "BGRA8888", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Xrgb2101010, "XRGB2101010", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Argb2101010, "ARGB2101010", &[p(4, 1, 1, 1)]),
    (DrmFourcc::Abgr16161616f, "ABGR16161616F", &[p(8, 1, 1, 1)]),
    (DrmFourcc::Rgb888, "RGB888", &[p(3, 1, 1, 1)]),
    (DrmFourcc::Bgr888, "BGR888", &[p(3, 1, 1, 1)]),
    (DrmFourcc::Rgb565, "RGB565", &[p(2, 1, 1, 1)]),
    (DrmFourcc::Xrgb1555, "XRGB1555", &[p(2, 1, 1, 1)]),
    (DrmFourcc::R8, "R8", &[p(1, 1, 1, 1)]),
    (DrmFourcc::R16, "R16", &[p(2, 1, 1, 1)]),
    (DrmFourcc::Gr88, "GR88", &[p(2, 1, 1, 1)]),
    (DrmFourcc::Yuyv, "YUYV", &[p(4, 2, 1, 1)]),
    (DrmFourcc::Yvyu, "YVYU", &[p(4, 2, 1, 1)]),
    (DrmFourcc::Uyvy, "UYVY", &[p(4, 2, 1, 1)]),
    (DrmFourcc::Vyuy, "VYUY", &[p(4, 2, 1, 1)]),
    (DrmFourcc::Nv12, "NV12", &[p(1, 1, 1, 1), p(2, 1, 2, 2)]),
    (DrmFourcc::Nv21, "NV21", &[p(1, 1, 1, 1), p(2, 1, 2, 2)]),
    (DrmFourcc::Nv16, "NV16", &[p(1, 1, 1, 1), p(2, 1, 2, 1)]),
    (DrmFourcc::P010, "P010", &[p(2, 1, 1, 1), p(4, 1, 2, 2)]),
    (
        DrmFourcc::Yuv420,
        "YUV420",
        &[p(1, 1, 1, 1), p(1, 1, 2, 2), p(1, 1, 2, 2)],
    ),
    (
        DrmFourcc::Yvu420,
        "YVU420",
        &[p(1, 1, 1, 1), p(1, 1, 2, 2), p(1, 1, 2, 2)],
    ),
];

/// The fourcc code as text, spaces trimmed (`XR24`, `R8`).
pub fn fourcc_code(f: DrmFourcc) -> String {
    f.to_string().trim_end().to_string()
}

fn invalid(what: &str, detail: impl Into<String>, check: Option<&str>) -> Error {
    Error::Invalid {
        what: what.to_string(),
        detail: detail.into(),
        check: check.map(str::to_string),
    }
}

fn known_formats() -> String {
    FORMATS
        .iter()
        .map(|(f, n, _)| format!("{} ({n})", fourcc_code(*f)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a format: a fourcc code (`XR24`, `NV12`, `R8`) or a name from [`FORMATS`]
/// (`XRGB8888`, case-insensitive).
pub fn parse_format(s: &str) -> Result<DrmFourcc> {
    let what = format!("format {s:?}");
    let t = s.trim();
    if let Some((f, _, _)) = FORMATS.iter().find(|(_, n, _)| n.eq_ignore_ascii_case(t)) {
        return Ok(*f);
    }
    let b = t.as_bytes();
    if !b.is_empty() && b.len() <= 4 && b.iter().all(|c| c.is_ascii_graphic()) {
        let mut code = [b' '; 4];
        code[..b.len()].copy_from_slice(b);
        let v = u32::from_le_bytes(code);
        return match DrmFourcc::try_from(v) {
            Ok(f) if planes_of(f).is_some() => Ok(f),
            Ok(f) => Err(invalid(
                &what,
                format!("DRM knows {f:?}, but its layout is not in p2pbuf's table"),
                Some(&format!("use one of {}", known_formats())),
            )),
            Err(_) => Err(invalid(
                &what,
                "not a DRM fourcc code (drm_fourcc.h)",
                Some(&format!("use one of {}", known_formats())),
            )),
        };
    }
    Err(invalid(
        &what,
        "expected a fourcc code (4 characters or fewer, e.g. XR24) or a format name (XRGB8888)",
        Some(&format!("known: {}", known_formats())),
    ))
}

/// The planes of a format in [`FORMATS`].
pub fn planes_of(f: DrmFourcc) -> Option<&'static [PlaneFormat]> {
    FORMATS.iter().find(|(x, _, _)| *x == f).map(|(_, _, p)| *p)
}

/// Parses a modifier: `LINEAR`, `I915_X_TILED`, `I915_Y_TILED` (case-insensitive, with or
/// without `DRM_FORMAT_MOD_`), or a number (`0x100000000000001`).
pub fn parse_modifier(s: &str) -> Result<DrmModifier> {
    let t = s.trim();
    let u = t.to_ascii_uppercase();
    let u = u.strip_prefix("DRM_FORMAT_MOD_").unwrap_or(&u);
    let m = match u {
        "LINEAR" | "L" => DrmModifier::Linear,
        "I915_X_TILED" | "X_TILED" | "X" => DrmModifier::I915_x_tiled,
        "I915_Y_TILED" | "Y_TILED" | "Y" => DrmModifier::I915_y_tiled,
        "INVALID" => DrmModifier::Invalid,
        _ => {
            let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            };
            DrmModifier::from(v.map_err(|_| {
                invalid(
                    &format!("modifier {s:?}"),
                    "expected LINEAR, I915_X_TILED, I915_Y_TILED or a number",
                    None,
                )
            })?)
        }
    };
    Ok(m)
}

/// Tile size (bytes wide, rows high) of a modifier; `(1, 1)` for linear; `None` when this
/// module does not know the layout.
pub fn tile_of(m: DrmModifier) -> Option<(u32, u32)> {
    match m {
        DrmModifier::Linear => Some((1, 1)),
        DrmModifier::I915_x_tiled => Some((512, 8)),
        DrmModifier::I915_y_tiled => Some((128, 32)),
        _ => None,
    }
}

fn modifier_name(m: DrmModifier) -> String {
    match m {
        DrmModifier::Linear => "LINEAR".into(),
        DrmModifier::I915_x_tiled => "I915_X_TILED".into(),
        DrmModifier::I915_y_tiled => "I915_Y_TILED".into(),
        other => format!("{:#x}", u64::from(other)),
    }
}

fn modifier_letter(m: DrmModifier) -> &'static str {
    match m {
        DrmModifier::I915_x_tiled => "X",
        DrmModifier::I915_y_tiled => "Y",
        _ => "L",
    }
}

/// One plane of a [`Surface`]'s layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Plane {
    /// Byte offset from the start of the buffer.
    pub offset: u64,
    /// Bytes from one row to the next.
    pub stride: u32,
    /// Rows (including tile padding).
    pub rows: u32,
}

/// A 2D image's description and layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Surface {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// DRM format.
    pub format: DrmFourcc,
    /// DRM format modifier.
    pub modifier: DrmModifier,
    /// The planes, in order.
    pub planes: Vec<Plane>,
    /// Bytes the image needs (end of the last plane).
    pub size: u64,
}

/// What a [`Surface`] is made from.
#[derive(Clone, Copy, Debug)]
pub struct SurfaceSpec {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// DRM format.
    pub format: DrmFourcc,
    /// DRM format modifier (`DrmModifier::Linear` when in doubt).
    pub modifier: DrmModifier,
    /// Stride of plane 0 in bytes; `None`: the smallest allowed, aligned to
    /// [`LINEAR_STRIDE_ALIGN`] (linear) or to the tile width.
    pub stride: Option<u32>,
}

/// Parses `1920x1080`.
pub fn parse_dims(s: &str) -> Result<(u32, u32)> {
    let what = format!("surface dimensions {s:?}");
    let (w, h) = s
        .trim()
        .split_once(['x', 'X'])
        .ok_or_else(|| invalid(&what, "expected WIDTHxHEIGHT, e.g. 1920x1080", None))?;
    let n = |v: &str| {
        v.parse::<u32>().map_err(|e| {
            invalid(
                &what,
                format!("{v:?} is not a number of pixels ({e})"),
                None,
            )
        })
    };
    Ok((n(w)?, n(h)?))
}

impl Surface {
    /// Computes the layout of `spec`, checking it.
    ///
    /// Errors ([`Error::Invalid`]): a zero or too large dimension, a format or modifier whose
    /// layout is unknown, a multi-plane format with a tiled modifier, a width or height that
    /// the format's subsampling does not divide, a stride below the row's bytes or not a
    /// multiple of the tile width (or that the chroma planes cannot share), a size that
    /// overflows 64 bits.
    ///
    /// Over 100 lines on purpose: the checks above in the order they depend on each other (format,
    /// dimensions, subsampling, per-plane strides, sizes), each using what the one before computed.
    pub fn new(spec: SurfaceSpec) -> Result<Surface> {
        let what = format!(
            "surface {}x{} {}",
            spec.width,
            spec.height,
            fourcc_code(spec.format)
        );
        for (name, v) in [("width", spec.width), ("height", spec.height)] {
            if v == 0 || v > MAX_DIM {
                return Err(invalid(
                    &what,
                    format!("{name} {v} is out of range 1..={MAX_DIM}"),
                    None,
                ));
            }
        }
        let planes = planes_of(spec.format).ok_or_else(|| {
            invalid(
                &what,
                format!("the layout of {:?} is not in p2pbuf's table", spec.format),
                Some(&format!("use one of {}", known_formats())),
            )
        })?;
        let (tile_w, tile_h) = tile_of(spec.modifier).ok_or_else(|| {
            invalid(
                &what,
                format!(
                    "the layout of modifier {} is vendor-private",
                    modifier_name(spec.modifier)
                ),
                Some("use LINEAR, I915_X_TILED or I915_Y_TILED, or allocate with --size"),
            )
        })?;
        if tile_w > 1 && planes.len() > 1 {
            return Err(invalid(
                &what,
                format!(
                    "{} with {} is not supported (tiled multi-plane layouts are driver-specific)",
                    fourcc_code(spec.format),
                    modifier_name(spec.modifier)
                ),
                Some("use LINEAR"),
            ));
        }
        // Bytes of one row of each plane, at the minimum.
        let mut rows_bytes = vec![];
        for pl in planes {
            let hdiv = pl.hsub * pl.block_w;
            if spec.width % hdiv != 0 || spec.height % pl.vsub != 0 {
                return Err(invalid(
                    &what,
                    format!(
                        "{} needs a width divisible by {hdiv} and a height divisible by {}",
                        fourcc_code(spec.format),
                        pl.vsub
                    ),
                    None,
                ));
            }
            rows_bytes.push(u64::from(spec.width / hdiv) * u64::from(pl.bytes));
        }
        let min0 = rows_bytes[0];
        let align = u64::from(if tile_w > 1 {
            tile_w
        } else {
            LINEAR_STRIDE_ALIGN
        });
        let stride0 = match spec.stride {
            Some(s) => {
                let s = u64::from(s);
                if s < min0 {
                    return Err(invalid(
                        &what,
                        format!("stride {s} is less than a row's {min0} bytes"),
                        Some(&format!("give --stride {min0} or more, or leave it out")),
                    ));
                }
                if s % u64::from(tile_w) != 0 {
                    return Err(invalid(
                        &what,
                        format!(
                            "stride {s} is not a multiple of the {tile_w}-byte tile width of {}",
                            modifier_name(spec.modifier)
                        ),
                        None,
                    ));
                }
                s
            }
            None => min0.div_ceil(align) * align,
        };
        let stride0 = u32::try_from(stride0).map_err(|_| {
            invalid(
                &what,
                format!("stride {stride0} does not fit 32 bits"),
                None,
            )
        })?;
        let mut out = vec![];
        let mut offset: u64 = 0;
        for (pl, rb) in planes.iter().zip(&rows_bytes) {
            // Chroma planes keep the luma plane's padding ratio: stride * rb / min0.
            let num = u64::from(stride0) * rb;
            if num % min0 != 0 {
                return Err(invalid(
                    &what,
                    format!("stride {stride0} cannot be split across the chroma planes"),
                    Some(&format!(
                        "use a stride divisible by {}",
                        min0 / rb.min(&min0)
                    )),
                ));
            }
            let stride = u32::try_from(num / min0)
                .map_err(|_| invalid(&what, "a plane stride does not fit 32 bits", None))?;
            let rows = (spec.height / pl.vsub).div_ceil(tile_h) * tile_h;
            out.push(Plane {
                offset,
                stride,
                rows,
            });
            offset = u64::from(stride)
                .checked_mul(u64::from(rows))
                .and_then(|b| b.checked_add(offset))
                .ok_or_else(|| invalid(&what, "the size overflows 64 bits", None))?;
        }
        Ok(Surface {
            width: spec.width,
            height: spec.height,
            format: spec.format,
            modifier: spec.modifier,
            planes: out,
            size: offset,
        })
    }

    /// Stride of plane 0.
    pub fn stride(&self) -> u32 {
        self.planes[0].stride
    }

    /// The name form, e.g. `s:1920x1080.XR24.7680.L` (at most [`NAME_MAX`] bytes).
    pub fn name(&self) -> String {
        format!(
            "{NAME_PREFIX}{}x{}.{}.{}.{}",
            self.width,
            self.height,
            fourcc_code(self.format),
            self.stride(),
            modifier_letter(self.modifier)
        )
    }

    /// Parses a dma-buf name: `None` when it is not a surface description (another program
    /// named the buffer), `Some(Err)` when it claims to be one but is malformed or invalid.
    pub fn from_name(name: &str) -> Option<Result<Surface>> {
        let rest = name.trim().strip_prefix(NAME_PREFIX)?;
        let bad = |detail: &str| {
            invalid(
                &format!("surface name {name:?}"),
                detail,
                Some("expected s:WIDTHxHEIGHT.FOURCC.STRIDE.L|X|Y"),
            )
        };
        let r = (|| {
            let f: Vec<&str> = rest.split('.').collect();
            let [dims, fourcc, stride, m] = f.as_slice() else {
                return Err(bad("not 4 dot-separated fields"));
            };
            let (width, height) = parse_dims(dims)?;
            let format = parse_format(fourcc)?;
            let stride: u32 = stride
                .parse()
                .map_err(|_| bad("the stride is not a number"))?;
            let modifier = match *m {
                "L" => DrmModifier::Linear,
                "X" => DrmModifier::I915_x_tiled,
                "Y" => DrmModifier::I915_y_tiled,
                _ => return Err(bad("the modifier is not L, X or Y")),
            };
            Surface::new(SurfaceSpec {
                width,
                height,
                format,
                modifier,
                stride: Some(stride),
            })
        })();
        Some(r)
    }

    /// A serializable summary (for `--json`).
    pub fn summary(&self) -> SurfaceSummary {
        SurfaceSummary {
            width: self.width,
            height: self.height,
            fourcc: fourcc_code(self.format),
            format: FORMATS
                .iter()
                .find(|(f, _, _)| *f == self.format)
                .map_or_else(String::new, |(_, n, _)| n.to_string()),
            fourcc_value: self.format as u32,
            modifier: modifier_name(self.modifier),
            modifier_value: u64::from(self.modifier),
            stride: self.stride(),
            planes: self.planes.clone(),
            size: self.size,
            name: self.name(),
        }
    }
}

impl fmt::Display for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary();
        write!(
            f,
            "{}x{} {} ({}) {}, stride {}, {} bytes",
            s.width, s.height, s.fourcc, s.format, s.modifier, s.stride, s.size
        )?;
        if self.planes.len() > 1 {
            let p: Vec<String> = self
                .planes
                .iter()
                .map(|p| format!("+{} stride {} x {} rows", p.offset, p.stride, p.rows))
                .collect();
            write!(f, "; planes {}", p.join(", "))?;
        }
        Ok(())
    }
}

/// What `--json` prints of a surface.
#[derive(Clone, Debug, Serialize)]
pub struct SurfaceSummary {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Fourcc code, e.g. `XR24`.
    pub fourcc: String,
    /// Format name, e.g. `XRGB8888`.
    pub format: String,
    /// The fourcc as a number.
    pub fourcc_value: u32,
    /// Modifier name, e.g. `LINEAR`.
    pub modifier: String,
    /// The modifier as a number.
    pub modifier_value: u64,
    /// Stride of plane 0.
    pub stride: u32,
    /// The planes.
    pub planes: Vec<Plane>,
    /// Bytes the image needs.
    pub size: u64,
    /// The dma-buf name form.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(w: u32, h: u32, f: &str) -> SurfaceSpec {
        SurfaceSpec {
            width: w,
            height: h,
            format: parse_format(f).unwrap(),
            modifier: DrmModifier::Linear,
            stride: None,
        }
    }

    #[test]
    fn full_hd_xrgb() {
        let s = Surface::new(spec(1920, 1080, "XR24")).unwrap();
        assert_eq!(s.stride(), 7680);
        assert_eq!(s.size, 7680 * 1080);
        assert_eq!(s.name(), "s:1920x1080.XR24.7680.L");
        assert_eq!(Surface::from_name(&s.name()).unwrap().unwrap(), s);
        assert_eq!(
            s.to_string(),
            "1920x1080 XR24 (XRGB8888) LINEAR, stride 7680, 8294400 bytes"
        );
    }

    #[test]
    fn format_names_and_codes() {
        assert_eq!(parse_format("XRGB8888").unwrap(), DrmFourcc::Xrgb8888);
        assert_eq!(parse_format("xrgb8888").unwrap(), DrmFourcc::Xrgb8888);
        assert_eq!(parse_format("NV12").unwrap(), DrmFourcc::Nv12);
        assert_eq!(parse_format("R8").unwrap(), DrmFourcc::R8);
        assert_eq!(fourcc_code(DrmFourcc::R8), "R8");
        let e = parse_format("ZZZZ").unwrap_err().to_string();
        assert!(e.contains("not a DRM fourcc"), "{e}");
        // Known to DRM, not to the table.
        let e = parse_format("Y410").unwrap_err().to_string();
        assert!(e.contains("not in p2pbuf's table"), "{e}");
        assert!(parse_format("TOOLONG").is_err());
        assert!(parse_format("").is_err());
    }

    #[test]
    fn default_stride_is_aligned_and_explicit_is_checked() {
        let s = Surface::new(spec(100, 10, "RG24")).unwrap();
        assert_eq!(s.stride(), 320, "300 bytes rounded to 64");
        let mut sp = spec(100, 10, "RG24");
        sp.stride = Some(300);
        assert_eq!(Surface::new(sp).unwrap().size, 3000);
        sp.stride = Some(299);
        let e = Surface::new(sp).unwrap_err().to_string();
        assert!(
            e.contains("stride 299 is less than a row's 300 bytes"),
            "{e}"
        );
    }

    #[test]
    fn planar_yuv() {
        let s = Surface::new(spec(1920, 1080, "NV12")).unwrap();
        assert_eq!(s.planes.len(), 2);
        assert_eq!(s.planes[1].offset, 1920 * 1080);
        assert_eq!(s.planes[1].stride, 1920);
        assert_eq!(s.planes[1].rows, 540);
        assert_eq!(s.size, 1920 * 1080 * 3 / 2);
        let s = Surface::new(spec(64, 4, "YU12")).unwrap();
        assert_eq!(
            s.planes,
            vec![
                Plane {
                    offset: 0,
                    stride: 64,
                    rows: 4
                },
                Plane {
                    offset: 256,
                    stride: 32,
                    rows: 2
                },
                Plane {
                    offset: 320,
                    stride: 32,
                    rows: 2
                },
            ]
        );
        assert_eq!(Surface::from_name(&s.name()).unwrap().unwrap(), s);
        let e = Surface::new(spec(1921, 1080, "NV12"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("width divisible by 2"), "{e}");
        let e = Surface::new(spec(7, 1, "YUYV")).unwrap_err().to_string();
        assert!(e.contains("width divisible by 2"), "{e}");
        let mut sp = spec(64, 4, "YU12");
        sp.stride = Some(65);
        let e = Surface::new(sp).unwrap_err().to_string();
        assert!(e.contains("cannot be split"), "{e}");
    }

    #[test]
    fn tiled_modifiers() {
        let mut sp = spec(1920, 1080, "XR24");
        sp.modifier = parse_modifier("I915_X_TILED").unwrap();
        let s = Surface::new(sp).unwrap();
        assert_eq!(s.stride(), 7680, "already a multiple of 512");
        assert_eq!(s.planes[0].rows, 1080, "1080 = 135 tiles of 8");
        sp.modifier = parse_modifier("y").unwrap();
        let s = Surface::new(sp).unwrap();
        assert_eq!(s.planes[0].rows, 1088, "rounded to tiles of 32 rows");
        assert_eq!(s.name(), "s:1920x1080.XR24.7680.Y");
        assert_eq!(Surface::from_name(&s.name()).unwrap().unwrap(), s);
        sp.stride = Some(7700);
        let e = Surface::new(sp).unwrap_err().to_string();
        assert!(
            e.contains("not a multiple of the 128-byte tile width"),
            "{e}"
        );
        let mut sp = spec(64, 64, "NV12");
        sp.modifier = DrmModifier::I915_x_tiled;
        assert!(Surface::new(sp).is_err());
        let mut sp = spec(64, 64, "XR24");
        sp.modifier = parse_modifier("0x0300000000000001").unwrap();
        let e = Surface::new(sp).unwrap_err().to_string();
        assert!(e.contains("vendor-private"), "{e}");
        assert!(parse_modifier("sideways").is_err());
        assert_eq!(
            parse_modifier("DRM_FORMAT_MOD_LINEAR").unwrap(),
            DrmModifier::Linear
        );
        assert_eq!(parse_modifier("0").unwrap(), DrmModifier::Linear);
    }

    #[test]
    fn limits_and_overflow() {
        for (w, h) in [(0, 1), (1, 0), (65536, 1), (1, 70000)] {
            let e = Surface::new(spec(w, h, "XR24")).unwrap_err().to_string();
            assert!(e.contains("out of range"), "{w}x{h}: {e}");
        }
        // The largest: stride u32 max, 65535 rows: no overflow in u64, name within 31 bytes.
        let mut sp = spec(65535, 65535, "AB4H");
        sp.stride = Some(u32::MAX);
        let s = Surface::new(sp).unwrap();
        assert_eq!(s.size, u64::from(u32::MAX) * 65535);
        assert!(s.name().len() <= NAME_MAX, "{}", s.name());
        assert_eq!(Surface::from_name(&s.name()).unwrap().unwrap(), s);
    }

    #[test]
    fn names_round_trip_or_are_refused() {
        assert!(Surface::from_name("p2pbuf").is_none());
        assert!(Surface::from_name("").is_none());
        for bad in [
            "s:",
            "s:1920x1080.XR24.7680",
            "s:1920x1080.XR24.7680.Q",
            "s:1920y1080.XR24.7680.L",
            "s:1920x1080.ZZZZ.7680.L",
            "s:1920x1080.XR24.abc.L",
            "s:1920x1080.XR24.100.L",
            "s:0x1080.XR24.7680.L",
        ] {
            assert!(
                matches!(Surface::from_name(bad), Some(Err(_))),
                "{bad} should be refused"
            );
        }
        let s = Surface::from_name("s:640x480.R8.640.L").unwrap().unwrap();
        assert_eq!(s.format, DrmFourcc::R8);
        assert_eq!(s.size, 640 * 480);
        assert_eq!(parse_dims("640X480").unwrap(), (640, 480));
        assert!(parse_dims("640").is_err());
        assert!(parse_dims("-1x4").is_err());
    }
}
