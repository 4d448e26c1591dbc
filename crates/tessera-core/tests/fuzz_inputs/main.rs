//! Fuzzing the core's readers of outside input (issue 9): the allocation
//! annotation codec and the pod request parser, with its quantity parsers.
//!
//! A seeded mutational fuzzer ([`fuzz`]): it starts from valid inputs, flips
//! and splices bytes, rewrites JSON values, and also builds inputs from the
//! grammar. Every input must come back as a value or as an error that says
//! what is wrong — never a panic — and where the right answer is known (a
//! signature cannot be forged, an integer quantity has one meaning) the answer
//! is checked too.
//!
//! `TESSERA_FUZZ_CASES` is the number of inputs per target (default 20,000:
//! under a second each in a debug build), `TESSERA_FUZZ_SEED` the seed. At the
//! issue's volume:
//! `TESSERA_FUZZ_CASES=1000000 cargo test --release -p tessera-core --test fuzz_inputs -- --nocapture`

mod allocation;
mod fuzz;
mod request;
