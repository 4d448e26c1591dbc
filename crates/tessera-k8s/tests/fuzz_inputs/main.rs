//! Fuzzing what Tessera's Kubernetes side reads from outside (issue 9): the
//! extender's request bodies (decoded, and through the real router) and the
//! admission webhook's AdmissionReview.
//!
//! A seeded mutational fuzzer (the harness is `tessera-core`'s, included by
//! path): it starts from the bodies a real kube-scheduler v1.28 sent
//! (`../shared/fixtures/kube-scheduler-v1.28-extender/`) and from reviews built
//! from the grammar of a pod, flips and splices bytes and rewrites JSON values.
//! Every input must come back as an answer or as a refusal that says what is
//! wrong, never a panic; the webhook's answers are also held to the rules it
//! exists for (who may touch the allocation, which pods get our scheduler,
//! which variables a Tessera pod may not set).
//!
//! `TESSERA_FUZZ_CASES` is the number of inputs per target (default 20,000, a
//! few seconds each in a debug build; the router gets a tenth),
//! `TESSERA_FUZZ_SEED` the seed. At the volume:
//! `TESSERA_FUZZ_CASES=1000000 cargo test --release -p tessera-k8s --test fuzz_inputs -- --nocapture`

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../tessera-core/tests/fuzz_inputs/fuzz.rs"]
mod fuzz;

mod admission;
mod extender;
