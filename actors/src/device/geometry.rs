//! Immutable transfer geometry of the device block arena: slot count and slot size, and the
//! address table (one device address per slot) built once at construction, so that no
//! serving submission performs a first-use upload or lookup.

use super::ops::DeviceError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceGeometry {
    pub slots: u32,
    pub slot_bytes: u64,
}

impl DeviceGeometry {
    pub fn new(slots: u32, slot_bytes: u64) -> Result<Self, DeviceError> {
        let g = Self { slots, slot_bytes };
        g.total_bytes()?;
        Ok(g)
    }

    /// Bytes of the whole arena; errors when empty or beyond the address space.
    pub fn total_bytes(&self) -> Result<usize, DeviceError> {
        if self.slots == 0 || self.slot_bytes == 0 {
            return Err(DeviceError::Geometry(
                "slots and slot_bytes must be greater than 0".into(),
            ));
        }
        (self.slots as u64)
            .checked_mul(self.slot_bytes)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| DeviceError::Geometry("arena size overflows".into()))
    }
}

/// Device address of every slot, bound at construction and never changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressTable {
    addresses: Box<[u64]>,
}

impl AddressTable {
    pub fn build(geometry: DeviceGeometry, slot_address: impl Fn(u32) -> u64) -> Self {
        Self {
            addresses: (0..geometry.slots).map(slot_address).collect(),
        }
    }

    pub fn get(&self, slot: u32) -> Option<u64> {
        self.addresses.get(slot as usize).copied()
    }

    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }
}
