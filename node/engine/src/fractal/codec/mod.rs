//! On-disk encoding of nodes, the block translation table and the headers (see
//! `node/engine/FORMAT.md`). Every integer is fixed-width little-endian; every record carries a
//! magic, a format version and a crc32c.

use std::cell::RefCell;

use super::filter::KeyFilter;
use super::msg::{count_at_or_below, key_prefix, Buffer, Msg, Msn, PointOp, RangeMsg, RangeOp, RunRef};

use super::limits::{const_len_u32, inner_len_u32, len_u32};
use super::node::{Basement, BasementBuilder, Internal, Leaf, Node, NodeId};
use crate::ops::UpsertOp;
use crate::{EngineError, Result};

mod basement;
mod btt;
mod buffer_frames;
mod compress;
#[cfg(test)]
mod decode_props;
mod frames;
mod header;
mod layout;
mod messages;
mod node_decode;
mod node_encode;
mod partial;
mod prim;
mod runs;
#[cfg(test)]
mod tests;

pub(crate) use self::basement::*;
pub(crate) use self::btt::*;
pub(crate) use self::buffer_frames::*;
pub(crate) use self::compress::*;
pub(crate) use self::frames::*;
pub(crate) use self::header::*;
pub(crate) use self::layout::*;
pub(crate) use self::messages::*;
pub(crate) use self::node_decode::*;
pub(crate) use self::node_encode::*;
pub(crate) use self::partial::*;
pub(crate) use self::prim::*;
pub(crate) use self::runs::*;
