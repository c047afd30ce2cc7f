//! Element counts bounded while deserializing: a crafted length makes the decoder stop at
//! the limit instead of building (and only then refusing) a huge collection. Used through
//! `#[serde(deserialize_with)]`, so the wire format is unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

use crate::validate::LIMITS;
use crate::{ChangeEvent, BATCH_EVENTS_MAX};

struct SeqMax<T> {
    max: usize,
    _t: PhantomData<T>,
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for SeqMax<T> {
    type Value = Vec<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a sequence of at most {} elements", self.max)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let hint = seq.size_hint().unwrap_or(0);
        if hint > self.max {
            return Err(A::Error::invalid_length(hint, &self));
        }
        let mut v = Vec::with_capacity(hint);
        while let Some(x) = seq.next_element()? {
            if v.len() == self.max {
                return Err(A::Error::invalid_length(self.max + 1, &self));
            }
            v.push(x);
        }
        Ok(v)
    }
}

struct MapMax {
    max: usize,
}

impl<'de> Visitor<'de> for MapMax {
    type Value = BTreeMap<String, String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a map of at most {} entries", self.max)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let hint = map.size_hint().unwrap_or(0);
        if hint > self.max {
            return Err(A::Error::invalid_length(hint, &self));
        }
        let mut m = BTreeMap::new();
        while let Some((k, v)) = map.next_entry()? {
            if m.len() == self.max {
                return Err(A::Error::invalid_length(self.max + 1, &self));
            }
            m.insert(k, v);
        }
        Ok(m)
    }
}

/// The events of a batch: at most [`BATCH_EVENTS_MAX`].
pub(crate) fn batch_events<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ChangeEvent>, D::Error> {
    d.deserialize_seq(SeqMax { max: BATCH_EVENTS_MAX, _t: PhantomData })
}

/// The tags of a record: at most `LIMITS.tags_max`.
pub(crate) fn tags<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    d.deserialize_seq(SeqMax { max: LIMITS.tags_max, _t: PhantomData })
}

/// The metadata of a record: at most `LIMITS.metadata_entries_max` entries.
pub(crate) fn metadata<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    d.deserialize_map(MapMax { max: LIMITS.metadata_entries_max })
}
