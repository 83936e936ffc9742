//! The frontend's shared vocabulary with the engine: the request limits, where a reused
//! prefix came from ([`PrefixUsage`], [`FallbackReason`]) and the synthetic model's token
//! text. Pure: no I/O, no HTTP (the OpenAI shapes are `super::openai`).

use serde::{Deserialize, Serialize};

/// Limits the frontend enforces before a request enters the round.
#[derive(Clone, Debug)]
pub struct RequestLimits {
    /// The longest prompt every cache group can hold.
    pub max_prompt_tokens: usize,
    pub max_output_tokens: u32,
    pub vocab_size: u32,
}

/// Why a request did not reuse a full prefix from L3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FallbackReason {
    None,
    Miss,
    Partial,
    Deadline,
    Pressure,
    Unhealthy,
    Quarantine,
    Disabled,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 8] = [
        FallbackReason::None,
        FallbackReason::Miss,
        FallbackReason::Partial,
        FallbackReason::Deadline,
        FallbackReason::Pressure,
        FallbackReason::Unhealthy,
        FallbackReason::Quarantine,
        FallbackReason::Disabled,
    ];
    /// The reason's position in `ALL` (a counter index).
    pub const fn index(self) -> usize {
        self as usize
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::None => "none",
            FallbackReason::Miss => "miss",
            FallbackReason::Partial => "partial",
            FallbackReason::Deadline => "deadline",
            FallbackReason::Pressure => "pressure",
            FallbackReason::Unhealthy => "unhealthy",
            FallbackReason::Quarantine => "quarantine",
            FallbackReason::Disabled => "disabled",
        }
    }
}

/// Where the reused prefix came from, and what was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixUsage {
    pub device: u32,
    pub host: u32,
    pub l3: u32,
    pub computed: u32,
    pub fallback_reason: FallbackReason,
}

impl PrefixUsage {
    pub fn cached(&self) -> u32 {
        self.device + self.host + self.l3
    }
}

/// Renders an output token as text (printable ASCII, deterministic).
pub fn token_text(t: u32) -> char {
    char::from(b'!' + (t % 94) as u8)
}

#[cfg(test)]
mod tests {
    use super::FallbackReason;

    #[test]
    fn fallback_index_is_the_position_in_all() {
        for (i, f) in FallbackReason::ALL.into_iter().enumerate() {
            assert_eq!(f.index(), i, "{}", f.as_str());
        }
        let names: std::collections::BTreeSet<_> =
            FallbackReason::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(names.len(), FallbackReason::ALL.len());
    }
}
