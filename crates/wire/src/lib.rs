//! picnic-wire: packet formats, parsed and emitted without panics on any bytes.
