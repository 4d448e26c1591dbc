//! The node's `ResourceSlice`s (`resource.k8s.io/v1`, protocols.md §3.3). Pure.
