//! [`ReloadableTls`]: TLS material re-read from its files while the process runs (on
//! SIGHUP), swapped in only after every check passed, and the configs built from it.

use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;

use super::{client_config_tuned, server_config_tuned, TlsError, TlsMaterial, TlsPaths};
use crate::gateway::TransportTuning;

/// TLS material that can be re-read from its files while the process runs.
///
/// Readers take a cheap snapshot ([`ReloadableTls::current`]); [`ReloadableTls::reload`]
/// swaps in new material only after it passed every check. Configs built from it use the
/// [`TransportTuning`] set with [`ReloadableTls::with_tuning`] (default otherwise).
#[derive(Debug)]
pub struct ReloadableTls {
    paths: TlsPaths,
    tuning: TransportTuning,
    current: Mutex<Arc<TlsMaterial>>,
    /// Serializes reloads so two concurrent reloads cannot interleave their checks.
    reloading: Mutex<()>,
}

impl ReloadableTls {
    /// Loads the material and checks its chain to the CA at the current time.
    pub fn load(paths: TlsPaths) -> Result<ReloadableTls, TlsError> {
        let material = load_checked(&paths, SystemTime::now())?;
        Ok(ReloadableTls {
            paths,
            tuning: TransportTuning::default(),
            current: Mutex::new(Arc::new(material)),
            reloading: Mutex::new(()),
        })
    }

    /// Uses `tuning` for every config built from now on; fails if it is inconsistent.
    pub fn with_tuning(mut self, tuning: TransportTuning) -> Result<ReloadableTls, TlsError> {
        tuning.transport_config()?;
        self.tuning = tuning;
        Ok(self)
    }

    /// Re-reads the files. On success the new material is in use for configs built from
    /// now on and is returned; on error the old material stays in use.
    ///
    /// The new certificate must chain to the (re-read) CA at the current time and must name
    /// the same DC as the material in use.
    pub fn reload(&self) -> Result<Arc<TlsMaterial>, TlsError> {
        let _reloading = self.reloading.lock();
        let material = load_checked(&self.paths, SystemTime::now())?;
        let loaded = self.current.lock().identity();
        if material.identity() != loaded {
            return Err(TlsError::IdentityChanged {
                path: self.paths.cert.clone(),
                loaded,
                reloaded: material.identity(),
            });
        }
        let material = Arc::new(material);
        *self.current.lock() = material.clone();
        Ok(material)
    }

    /// A snapshot of the material in use.
    pub fn current(&self) -> Arc<TlsMaterial> {
        self.current.lock().clone()
    }

    /// The files this material is read from.
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }

    /// The transport tuning configs are built with.
    pub fn tuning(&self) -> &TransportTuning {
        &self.tuning
    }

    /// A fresh server config from the material in use (see [`server_config_tuned`]); hand
    /// it to `quinn::Endpoint::set_server_config` after a reload.
    pub fn server_config(&self, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
        server_config_tuned(&self.current(), alpn, &self.tuning)
    }

    /// A fresh client config from the material in use (see [`client_config_tuned`]); build
    /// one per connection attempt so a reload applies to the next dial.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        client_config_tuned(&self.current(), alpn, &self.tuning)
    }
}

fn load_checked(paths: &TlsPaths, now: SystemTime) -> Result<TlsMaterial, TlsError> {
    let material = TlsMaterial::load(paths)?;
    material.check_chain(now)?;
    Ok(material)
}
