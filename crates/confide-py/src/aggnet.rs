//! `confide._native.DataServer`: the aggregator's data port (crate `confide-aggnet`).
//! `PushSlices` streams are received, parsed and folded in Rust; the Python control
//! object is called (with the GIL) once per stream and for completed slices only.
//!
//! The control object has these methods (see `confide.aggregator.service.NativeDataPath`):
//! `open(peer_der, header_message) -> (round_id, position, token) | None`,
//! `observing -> bool` (attribute), `observe(token, message)`,
//! `folded(token, [(index, bytes)])`, `refused(token, kind, message, slices) -> int`,
//! `ended(token) -> bool`, and `status_of(exception) -> (grpc code, message)`.

use crate::agg::PyDataPlane;
use confide_aggnet::{Control, DataServer, Opened, Refusal, ServerConfig, StreamInfo};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::net::ToSocketAddrs;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::Code;

/// Adds the class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDataServer>()
}

struct PyControl {
    object: Py<PyAny>,
    observing: bool,
}

impl PyControl {
    fn refusal(&self, py: Python<'_>, error: &PyErr) -> Refusal {
        let status = self.object.call_method1(py, "status_of", (error.value(py),)).and_then(|r| r.extract::<(i32, String)>(py));
        match status {
            Ok((code, message)) => Refusal::new(Code::from_i32(code), message),
            Err(_) => Refusal::new(Code::Internal, error.to_string()),
        }
    }

    fn logged(&self, py: Python<'_>, what: &str, error: &PyErr) {
        let _ = self.object.call_method1(py, "log_failure", (what, error.value(py)));
    }
}

impl Control for PyControl {
    fn open(&self, peer_certificate: Option<&[u8]>, header_message: &[u8]) -> Result<Opened, Refusal> {
        Python::attach(|py| {
            let peer = peer_certificate.map(|p| PyBytes::new(py, p));
            let opened = self
                .object
                .call_method1(py, "open", (peer, PyBytes::new(py, header_message)))
                .and_then(|r| r.extract::<Option<(u64, u32, u64)>>(py));
            match opened {
                Ok(Some((round_id, participant, token))) => Ok(Opened::Fold(StreamInfo { round_id, participant, token })),
                Ok(None) => Ok(Opened::Complete),
                Err(e) => Err(self.refusal(py, &e)),
            }
        })
    }

    fn observing(&self) -> bool {
        self.observing
    }

    fn observe(&self, stream: &StreamInfo, message: &[u8]) {
        Python::attach(|py| {
            if let Err(e) = self.object.call_method1(py, "observe", (stream.token, PyBytes::new(py, message))) {
                self.logged(py, "observe", &e);
            }
        });
    }

    fn folded(&self, stream: &StreamInfo, completed: Vec<(u32, Vec<u8>)>) -> Result<(), Refusal> {
        Python::attach(|py| {
            let completed: Vec<(u32, Bound<'_, PyBytes>)> = completed.into_iter().map(|(i, b)| (i, PyBytes::new(py, &b))).collect();
            self.object.call_method1(py, "folded", (stream.token, completed)).map(|_| ()).map_err(|e| self.refusal(py, &e))
        })
    }

    fn refused(&self, stream: &StreamInfo, error: &confide_agg::Error, slices: u32) -> Result<u32, Refusal> {
        use confide_agg::Error as E;
        let kind = match error {
            E::UnknownRound { .. } => "closed",
            E::InvalidParameter { .. } | E::Slice { .. } | E::Batch(_) | E::Malformed { .. } | E::Paillier { .. } | E::Crypto(_) => {
                "invalid"
            }
            E::Io { .. } | E::Stopped { .. } => "internal",
        };
        Python::attach(|py| {
            self.object
                .call_method1(py, "refused", (stream.token, kind, error.to_string(), slices))
                .and_then(|r| r.extract::<u32>(py))
                .map_err(|e| self.refusal(py, &e))
        })
    }

    fn ended(&self, stream: &StreamInfo) -> bool {
        Python::attach(|py| match self.object.call_method1(py, "ended", (stream.token,)).and_then(|r| r.extract::<bool>(py)) {
            Ok(complete) => complete,
            Err(e) => {
                self.logged(py, "ended", &e);
                false
            }
        })
    }
}

/// The data port: `PushSlices` over gRPC with mutual TLS, folded straight into a `DataPlane`.
#[pyclass(name = "DataServer", module = "confide._native", frozen)]
struct PyDataServer {
    inner: Mutex<Option<DataServer>>,
    port: u16,
}

#[pymethods]
impl PyDataServer {
    #[new]
    #[pyo3(signature = (plane, control, address, cert_pem, key_pem, ca_pem, threads = 0,
                        max_message_bytes = 64 << 20, stream_window_bytes = 2 << 20))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        plane: &PyDataPlane,
        control: Py<PyAny>,
        address: &str,
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_pem: Vec<u8>,
        threads: usize,
        max_message_bytes: usize,
        stream_window_bytes: u32,
    ) -> PyResult<Self> {
        let address = address
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| crate::errors::invalid("address", format!("{address:?} is not a host:port to listen on")))?;
        let observing = control.getattr(py, "observing")?.extract::<bool>(py)?;
        let config = ServerConfig { address, cert_pem, key_pem, ca_pem, threads, max_message_bytes, stream_window_bytes };
        let control: Arc<dyn Control> = Arc::new(PyControl { object: control, observing });
        let plane = plane.inner.clone();
        let server = py.detach(move || DataServer::start(config, plane, control)).map_err(crate::errors::to_py)?;
        let port = server.port();
        Ok(PyDataServer { inner: Mutex::new(Some(server)), port })
    }

    /// The bound port.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server: open streams end, threads are joined (at most `grace_s`).
    #[pyo3(signature = (grace_s = 1.0))]
    fn stop(&self, py: Python<'_>, grace_s: f64) {
        let server = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(mut server) = server {
            py.detach(move || server.stop(Duration::from_secs_f64(grace_s.clamp(0.0, 60.0))));
        }
    }
}
