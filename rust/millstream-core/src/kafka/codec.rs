//! The compression codecs of record batches (the batch attributes' low three bits), all
//! decoded in pure Rust: gzip (miniz_oxide through flate2), snappy (raw, and the xerial
//! framing Java producers write), lz4 (the LZ4 frame format) and zstd (ruzstd).

use std::borrow::Cow;
use std::io::Read;

/// A batch's codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// Not compressed.
    None,
    /// gzip.
    Gzip,
    /// snappy.
    Snappy,
    /// lz4 (frame format).
    Lz4,
    /// zstd.
    Zstd,
}

impl Codec {
    /// The codec of batch attributes, or an error naming the unknown code.
    pub fn from_attributes(attributes: i16) -> Result<Self, String> {
        match attributes & 0x07 {
            0 => Ok(Self::None),
            1 => Ok(Self::Gzip),
            2 => Ok(Self::Snappy),
            3 => Ok(Self::Lz4),
            4 => Ok(Self::Zstd),
            other => Err(format!("unknown compression codec {other}")),
        }
    }

    /// The codec's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }

    /// Decompresses a batch's records section (borrowed as it is when not compressed);
    /// `capacity` is a hint of its size.
    pub fn decompress(self, data: &[u8], capacity: usize) -> Result<Cow<'_, [u8]>, String> {
        let mut out = Vec::with_capacity(capacity);
        let failed =
            |e: &dyn std::fmt::Display| format!("{} data does not decompress: {e}", self.name());
        match self {
            Self::None => return Ok(Cow::Borrowed(data)),
            Self::Gzip => {
                flate2::read::MultiGzDecoder::new(data)
                    .read_to_end(&mut out)
                    .map_err(|e| failed(&e))?;
            }
            Self::Snappy => snappy(data, &mut out).map_err(|e| failed(&e))?,
            Self::Lz4 => {
                lz4_flex::frame::FrameDecoder::new(data)
                    .read_to_end(&mut out)
                    .map_err(|e| failed(&e))?;
            }
            Self::Zstd => {
                let mut source = data;
                ruzstd::decoding::StreamingDecoder::new(&mut source)
                    .map_err(|e| failed(&e))?
                    .read_to_end(&mut out)
                    .map_err(|e| failed(&e))?;
            }
        }
        Ok(Cow::Owned(out))
    }
}

/// The header of xerial's snappy framing (what Java's snappy-java writes).
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

fn snappy(data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut decoder = snap::raw::Decoder::new();
    if !data.starts_with(XERIAL_MAGIC) {
        *out = decoder.decompress_vec(data).map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut at = XERIAL_MAGIC.len() + 8; // version, compatible version
    while at < data.len() {
        let len = data
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or("a cut xerial block length")?;
        let block = data.get(at + 4..at + 4 + len).ok_or("a cut xerial block")?;
        out.extend(decoder.decompress_vec(block).map_err(|e| e.to_string())?);
        at += 4 + len;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;

    use super::*;

    /// `data` compressed with `codec` as producers do.
    pub(crate) fn compress(codec: Codec, data: &[u8]) -> Vec<u8> {
        match codec {
            Codec::None => data.to_vec(),
            Codec::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Codec::Snappy => snap::raw::Encoder::new().compress_vec(data).unwrap(),
            Codec::Lz4 => {
                let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Codec::Zstd => {
                ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
            }
        }
    }

    const ALL: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..10_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for codec in ALL {
            let packed = compress(codec, &data);
            assert_eq!(
                *codec.decompress(&packed, 0).unwrap(),
                data,
                "{}",
                codec.name()
            );
        }
    }

    #[test]
    fn xerial_framed_snappy_decodes() {
        let mut framed = XERIAL_MAGIC.to_vec();
        framed.extend([0, 0, 0, 1, 0, 0, 0, 1]);
        for part in [&b"hello "[..], b"world"] {
            let block = snap::raw::Encoder::new().compress_vec(part).unwrap();
            framed.extend((block.len() as u32).to_be_bytes());
            framed.extend(block);
        }
        assert_eq!(
            *Codec::Snappy.decompress(&framed, 0).unwrap(),
            b"hello world"[..]
        );
    }

    #[test]
    fn garbage_is_an_error_for_every_codec() {
        for codec in ALL.into_iter().skip(1) {
            let err = codec
                .decompress(b"\x01\x02not compressed at all", 0)
                .unwrap_err();
            assert!(err.contains(codec.name()), "{err}");
        }
        assert!(Codec::from_attributes(5).is_err());
        assert_eq!(Codec::from_attributes(0x14), Ok(Codec::Zstd));
    }
}
