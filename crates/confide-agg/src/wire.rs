//! A serialized `PushMessage` carrying a `SliceBatch` (proto/confide/v1/runtime.proto), read
//! in place: the aggregator hands the message bytes it received straight to the data plane,
//! so the slice payload is never copied out of the received buffer.
//!
//! `PushMessage { oneof body { RoundHeader header = 1; Slice slice = 2; SliceBatch batch = 3; } }`
//! `SliceBatch { repeated uint32 indices = 1; repeated uint32 n_valid = 2; repeated uint32 lengths = 3; bytes payload = 4; }`
//! Repeated fields are accepted packed (proto3's default) or unpacked; unknown fields are skipped.

use crate::error::{Error, Result};

/// The fields of a batch message; `payload` is a byte range of the message.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BatchView {
    /// Slice indices.
    pub indices: Vec<u32>,
    /// Values per slice.
    pub n_valid: Vec<u32>,
    /// Payload bytes per slice.
    pub lengths: Vec<u32>,
    /// Start of the concatenated payloads in the message.
    pub payload_start: usize,
    /// Length of the concatenated payloads.
    pub payload_len: usize,
}

fn malformed(reason: impl Into<String>) -> Error {
    Error::Malformed { what: "push message", reason: reason.into() }
}

fn varint(bytes: &[u8], at: &mut usize) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or_else(|| malformed("truncated varint"))?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed("varint longer than 10 bytes"))
}

fn length_delimited(bytes: &[u8], at: &mut usize) -> Result<(usize, usize)> {
    let len = usize::try_from(varint(bytes, at)?).map_err(|_| malformed("length overflows"))?;
    let start = *at;
    let end = start.checked_add(len).filter(|&e| e <= bytes.len()).ok_or_else(|| malformed("field runs past the end"))?;
    *at = end;
    Ok((start, end))
}

fn skip(bytes: &[u8], at: &mut usize, wire: u64) -> Result<()> {
    match wire {
        0 => varint(bytes, at).map(|_| ()),
        1 => advance(bytes, at, 8),
        2 => length_delimited(bytes, at).map(|_| ()),
        5 => advance(bytes, at, 4),
        other => Err(malformed(format!("unsupported wire type {other}"))),
    }
}

fn advance(bytes: &[u8], at: &mut usize, n: usize) -> Result<()> {
    *at = at.checked_add(n).filter(|&e| e <= bytes.len()).ok_or_else(|| malformed("fixed field runs past the end"))?;
    Ok(())
}

fn u32_value(value: u64) -> Result<u32> {
    u32::try_from(value).map_err(|_| malformed(format!("value {value} does not fit uint32")))
}

fn repeated(bytes: &[u8], at: &mut usize, wire: u64, out: &mut Vec<u32>) -> Result<()> {
    match wire {
        0 => out.push(u32_value(varint(bytes, at)?)?),
        2 => {
            let (mut p, end) = length_delimited(bytes, at)?;
            while p < end {
                out.push(u32_value(varint(&bytes[..end], &mut p)?)?);
            }
        }
        other => return Err(malformed(format!("repeated uint32 with wire type {other}"))),
    }
    Ok(())
}

/// The batch of a serialized `PushMessage`, or `None` when its body is not a batch.
pub fn parse_batch(message: &[u8]) -> Result<Option<BatchView>> {
    let mut at = 0;
    let mut found: Option<(usize, usize)> = None;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        if field == 3 && wire == 2 {
            found = Some(length_delimited(message, &mut at)?);
        } else if (field == 1 || field == 2) && wire == 2 {
            length_delimited(message, &mut at)?;
            found = None; // a later oneof member wins, as in protobuf
        } else {
            skip(message, &mut at, wire)?;
        }
    }
    let Some((start, end)) = found else { return Ok(None) };
    let mut view = BatchView { payload_start: start, ..BatchView::default() };
    let body = &message[..end];
    let mut p = start;
    while p < end {
        let key = varint(body, &mut p)?;
        match (key >> 3, key & 7) {
            (1, wire) => repeated(body, &mut p, wire, &mut view.indices)?,
            (2, wire) => repeated(body, &mut p, wire, &mut view.n_valid)?,
            (3, wire) => repeated(body, &mut p, wire, &mut view.lengths)?,
            (4, 2) => {
                let (s, e) = length_delimited(body, &mut p)?;
                view.payload_start = s;
                view.payload_len = e - s;
            }
            (_, wire) => skip(body, &mut p, wire)?,
        }
    }
    if view.indices.len() != view.n_valid.len() || view.indices.len() != view.lengths.len() {
        return Err(malformed(format!(
            "batch.indices, batch.n_valid and batch.lengths differ in length ({}, {}, {})",
            view.indices.len(),
            view.n_valid.len(),
            view.lengths.len()
        )));
    }
    let total: u64 = view.lengths.iter().map(|&l| u64::from(l)).sum();
    if total != view.payload_len as u64 {
        return Err(malformed(format!("batch.payload holds {} bytes; batch.lengths add up to {total}", view.payload_len)));
    }
    Ok(Some(view))
}

/// What a received `PushMessage` carries.
#[derive(Debug, PartialEq, Eq)]
pub enum PushBody {
    /// A `RoundHeader` (left serialized: the control side reads it).
    Header,
    /// Slices: a batch, or one `Slice { uint32 index = 1; uint32 n_valid = 2; bytes payload = 3; }`
    /// seen as a batch of one.
    Slices(BatchView),
    /// No body.
    Empty,
}

/// The body of a serialized `PushMessage`, slices read in place.
///
/// # Errors
/// `Malformed` naming what does not parse.
pub fn parse_push(message: &[u8]) -> Result<PushBody> {
    if let Some(view) = parse_batch(message)? {
        return Ok(PushBody::Slices(view));
    }
    let mut at = 0;
    let mut body: Option<(u64, usize, usize)> = None;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let (field, wire) = (key >> 3, key & 7);
        if (field == 1 || field == 2) && wire == 2 {
            let (start, end) = length_delimited(message, &mut at)?;
            body = Some((field, start, end));
        } else {
            skip(message, &mut at, wire)?;
        }
    }
    match body {
        None => Ok(PushBody::Empty),
        Some((1, _, _)) => Ok(PushBody::Header),
        Some((_, start, end)) => {
            let slice = &message[..end];
            let (mut index, mut n_valid, mut payload) = (0u32, 0u32, (start, start));
            let mut p = start;
            while p < end {
                let key = varint(slice, &mut p)?;
                match (key >> 3, key & 7) {
                    (1, 0) => index = u32_value(varint(slice, &mut p)?)?,
                    (2, 0) => n_valid = u32_value(varint(slice, &mut p)?)?,
                    (3, 2) => payload = length_delimited(slice, &mut p)?,
                    (_, wire) => skip(slice, &mut p, wire)?,
                }
            }
            let len = payload.1 - payload.0;
            let length = u32::try_from(len).map_err(|_| malformed(format!("slice.payload of {len} bytes does not fit uint32")))?;
            Ok(PushBody::Slices(BatchView {
                indices: vec![index],
                n_valid: vec![n_valid],
                lengths: vec![length],
                payload_start: payload.0,
                payload_len: len,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn packed(out: &mut Vec<u8>, field: u64, values: &[u32]) {
        let mut body = Vec::new();
        for &v in values {
            put_varint(&mut body, u64::from(v));
        }
        put_varint(out, (field << 3) | 2);
        put_varint(out, body.len() as u64);
        out.extend(body);
    }

    fn batch(indices: &[u32], n_valid: &[u32], payloads: &[&[u8]], packed_form: bool) -> Vec<u8> {
        let mut body = Vec::new();
        let lengths: Vec<u32> = payloads.iter().map(|p| p.len() as u32).collect();
        for (field, values) in [(1u64, indices), (2, n_valid), (3, &lengths[..])] {
            if packed_form {
                packed(&mut body, field, values);
            } else {
                for &v in values {
                    put_varint(&mut body, field << 3);
                    put_varint(&mut body, u64::from(v));
                }
            }
        }
        let payload: Vec<u8> = payloads.concat();
        put_varint(&mut body, (4 << 3) | 2);
        put_varint(&mut body, payload.len() as u64);
        body.extend(payload);
        let mut message = Vec::new();
        put_varint(&mut message, (3 << 3) | 2);
        put_varint(&mut message, body.len() as u64);
        message.extend(body);
        message
    }

    #[test]
    fn packed_and_unpacked_batches_parse_to_the_same_view() -> Result<()> {
        let payloads: [&[u8]; 3] = [b"abcd", b"", b"0123456789"];
        for form in [true, false] {
            let message = batch(&[7, 300, 2], &[1, 0, 3], &payloads, form);
            let view = parse_batch(&message)?.ok_or_else(|| malformed("no batch"))?;
            assert_eq!(view.indices, vec![7, 300, 2]);
            assert_eq!(view.n_valid, vec![1, 0, 3]);
            assert_eq!(view.lengths, vec![4, 0, 10]);
            assert_eq!(&message[view.payload_start..view.payload_start + view.payload_len], b"abcd0123456789");
        }
        Ok(())
    }

    #[test]
    fn non_batch_and_malformed_messages() {
        // header (field 1) → not a batch
        assert!(matches!(parse_batch(&[0x0a, 0x00]), Ok(None)));
        assert!(matches!(parse_batch(&[]), Ok(None)));
        // truncated
        let message = batch(&[1], &[1], &[b"abcd"], true);
        assert!(parse_batch(&message[..message.len() - 1]).is_err());
        // lengths that do not add up to the payload
        let mut body = Vec::new();
        packed(&mut body, 1, &[1, 2]);
        packed(&mut body, 2, &[1, 1]);
        packed(&mut body, 3, &[2, 3]);
        body.extend([0x22, 0x04]);
        body.extend(b"abcd");
        let mut bad = vec![0x1a, body.len() as u8];
        bad.extend(body);
        assert!(parse_batch(&bad).is_err_and(|e| e.to_string().contains("add up to 5")));
        assert!(parse_batch(&[0x1a, 0x05, 0x08]).is_err());
        assert!(parse_batch(&[0xff; 11]).is_err());
    }

    #[test]
    fn push_bodies() -> Result<()> {
        assert_eq!(parse_push(&[0x0a, 0x02, 0x08, 0x01])?, PushBody::Header);
        assert_eq!(parse_push(&[])?, PushBody::Empty);
        // Slice { index: 5, n_valid: 2, payload: "abcdefgh" }
        let mut slice = vec![0x08, 0x05, 0x10, 0x02, 0x1a, 0x08];
        slice.extend(b"abcdefgh");
        let mut message = vec![0x12, slice.len() as u8];
        message.extend(&slice);
        let PushBody::Slices(view) = parse_push(&message)? else { return Err(malformed("not slices")) };
        assert_eq!((view.indices, view.n_valid, view.lengths), (vec![5], vec![2], vec![8]));
        assert_eq!(&message[view.payload_start..view.payload_start + view.payload_len], b"abcdefgh");
        let batched = batch(&[1, 2], &[1, 1], &[b"abcd", b"efgh"], true);
        assert!(matches!(parse_push(&batched)?, PushBody::Slices(v) if v.indices == vec![1, 2]));
        assert!(parse_push(&message[..message.len() - 2]).is_err());
        Ok(())
    }
}
