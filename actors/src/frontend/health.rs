//! A rank's health as an orchestrator reads it: liveness (the process answers) apart from
//! readiness (it takes traffic). The round loop records what it knows — each exported
//! round, a failure, the start of shutdown — and the HTTP side renders one document from
//! it for `/health`, `/health/ready` and the readiness verdict.
//!
//! Not ready: before the first agreed round (the mesh is forming), while the rank's L3
//! storage is quarantined (an unretired result: only a restart brings L3 back), after the
//! replica failed, while shutting down, and — only with
//! `server.not_ready_on_storage_outage` — while the store cools down after an outage. A
//! store that is cooling down or probing otherwise leaves the rank ready but `degraded`:
//! requests still complete (they recompute), a shared store's outage would otherwise take
//! every replica out of service at once, and a rank without traffic never probes.

use messages::{HealthState, HealthStatus};

/// What one exported round says about the rank.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundHealth {
    pub round: u64,
    pub namespace: String,
    pub live_requests: usize,
    pub storage: Option<HealthState>,
    pub l3_enabled: bool,
}

#[derive(Debug, Default)]
struct State {
    round: Option<RoundHealth>,
    failed: Option<String>,
    stopping: bool,
}

/// The rank's health, shared by the round loop (writer) and the HTTP side (reader).
#[derive(Debug)]
pub struct RankHealth {
    not_ready_on_storage_outage: bool,
    state: parking_lot::Mutex<State>,
}

impl RankHealth {
    pub fn new(not_ready_on_storage_outage: bool) -> Self {
        Self {
            not_ready_on_storage_outage,
            state: Default::default(),
        }
    }

    /// An exported round.
    pub fn record_round(&self, r: RoundHealth) {
        self.state.lock().round = Some(r);
    }

    /// The replica failed (the first failure is kept).
    pub fn fail(&self, why: impl Into<String>) {
        let mut st = self.state.lock();
        if st.failed.is_none() {
            st.failed = Some(why.into());
        }
    }

    /// Shutdown began: no new traffic.
    pub fn stopping(&self) {
        self.state.lock().stopping = true;
    }

    /// The replica's failure, once recorded.
    pub fn failure(&self) -> Option<String> {
        self.state
            .lock()
            .failed
            .as_ref()
            .map(|why| failed_reason(why))
    }

    /// (ready, the JSON document).
    pub fn render(&self) -> (bool, String) {
        let st = self.state.lock();
        let storage = st.round.as_ref().and_then(|r| r.storage);
        let (status, reason): (&str, Option<String>) = if let Some(why) = &st.failed {
            ("failed", Some(failed_reason(why)))
        } else if st.stopping {
            ("stopping", Some("the engine host is shutting down".into()))
        } else if st.round.is_none() {
            (
                "starting",
                Some("no agreed round yet (the TP mesh is forming)".into()),
            )
        } else {
            match storage.map(|h| h.state) {
                Some(HealthStatus::Quarantined) => (
                    "quarantined",
                    Some("L3 storage is quarantined (an unretired result was seen): restart the process to use L3 again".into()),
                ),
                Some(s @ (HealthStatus::Cooldown | HealthStatus::Probing)) => (
                    "degraded",
                    Some(format!(
                        "L3 storage is unhealthy ({s:?}) after an outage: requests recompute until it recovers"
                    )),
                ),
                _ => ("ok", None),
            }
        };
        let ready = match status {
            "ok" => true,
            "degraded" => !self.not_ready_on_storage_outage,
            _ => false,
        };
        let doc = serde_json::json!({
            "status": status,
            "ready": ready,
            "reason": reason,
            "round": st.round.as_ref().map(|r| r.round),
            "namespace": st.round.as_ref().map(|r| r.namespace.clone()),
            "live_requests": st.round.as_ref().map(|r| r.live_requests),
            "storage": storage.map(|h| serde_json::json!({"state": format!("{:?}", h.state), "epoch": h.epoch})),
            "l3_enabled": st.round.as_ref().map(|r| r.l3_enabled),
        });
        (ready, doc.to_string())
    }
}

fn failed_reason(why: &str) -> String {
    format!("the replica failed: {why}")
}

impl super::HealthSource for RankHealth {
    fn render(&self) -> (bool, String) {
        RankHealth::render(self)
    }
    fn failure(&self) -> Option<String> {
        RankHealth::failure(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(storage: Option<HealthStatus>) -> RoundHealth {
        RoundHealth {
            round: 7,
            namespace: "tsl3-x".into(),
            live_requests: 0,
            storage: storage.map(|state| HealthState { state, epoch: 1 }),
            l3_enabled: storage.is_some(),
        }
    }

    fn doc(h: &RankHealth) -> (bool, serde_json::Value) {
        let (ready, d) = h.render();
        (ready, serde_json::from_str(&d).unwrap())
    }

    #[test]
    fn not_ready_until_the_first_round() {
        let h = RankHealth::new(false);
        let (ready, d) = doc(&h);
        assert!(!ready);
        assert_eq!(d["status"], "starting");
        assert!(d["reason"].as_str().unwrap().contains("mesh"));
        h.record_round(round(Some(HealthStatus::Healthy)));
        let (ready, d) = doc(&h);
        assert!(ready);
        assert_eq!(d["status"], "ok");
        assert!(d["reason"].is_null());
        assert_eq!(d["round"], 7);
        h.record_round(round(None));
        assert!(h.render().0, "storage disabled is ready");
    }

    #[test]
    fn quarantine_failure_and_shutdown_are_not_ready() {
        let h = RankHealth::new(false);
        h.record_round(round(Some(HealthStatus::Quarantined)));
        let (ready, d) = doc(&h);
        assert!(!ready);
        assert_eq!(d["status"], "quarantined");
        assert!(d["reason"].as_str().unwrap().contains("restart"));
        assert_eq!(d["storage"]["state"], "Quarantined");

        let h = RankHealth::new(false);
        h.record_round(round(Some(HealthStatus::Healthy)));
        h.stopping();
        assert_eq!(doc(&h).1["status"], "stopping");
        assert!(!h.render().0);
        h.fail("round 9: rank 1 disconnected");
        h.fail("a later error");
        let (ready, d) = doc(&h);
        assert!(!ready);
        assert_eq!(d["status"], "failed");
        assert!(d["reason"]
            .as_str()
            .unwrap()
            .contains("rank 1 disconnected"));
    }

    #[test]
    fn a_storage_outage_is_degraded_and_ready_unless_configured_otherwise() {
        for s in [HealthStatus::Cooldown, HealthStatus::Probing] {
            let h = RankHealth::new(false);
            h.record_round(round(Some(s)));
            let (ready, d) = doc(&h);
            assert!(ready, "{s:?}");
            assert_eq!(d["status"], "degraded");
            assert!(d["reason"].as_str().unwrap().contains("unhealthy"));
            let h = RankHealth::new(true);
            h.record_round(round(Some(s)));
            let (ready, d) = doc(&h);
            assert!(!ready, "{s:?}");
            assert_eq!(d["status"], "degraded");
        }
    }
}
