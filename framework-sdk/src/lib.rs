//! Framework SDK.
