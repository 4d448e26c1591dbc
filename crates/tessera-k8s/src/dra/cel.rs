//! CEL device selectors (protocols.md §3.7), on the `cel` crate.
//!
//! A selector sees one variable, `device`: `driver`, `attributes` and
//! `capacity` grouped by domain (an unqualified name belongs to the driver's
//! domain), and `allowMultipleAllocations`. Capacities are quantities, compared
//! with `quantity("40Gi")` and the methods Kubernetes adds for them
//! (`compareTo`, `isGreaterThan`, `isLessThan`, `sign`). Versions are kept
//! opaque: `semver()` and its methods are not provided, so an expression that
//! uses them fails with an error naming `semver` rather than matching wrongly.
//!
//! Like kube-scheduler, any runtime error (a missing attribute, a result that is
//! not a bool, an unsupported function) is an error for the whole claim, never
//! a silent "does not match": the claim stays unallocated and the error says
//! which expression failed and why. Two known departures from the API server,
//! both errors rather than wrong answers: an unknown domain is a missing key
//! here (upstream it is an empty map, so `has()` on it is `false` there), and
//! list-typed attributes are refused when the inventory is read.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::extractors::This;
use cel::objects::Opaque;
use cel::{Context, ExecutionError, Program, Value};

use super::quantity::Quantity;

/// A device attribute's typed value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttrValue {
    Int(i64),
    Bool(bool),
    String(String),
    /// A semantic version, as published.
    Version(String),
}

/// A quantity inside CEL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CelQuantity(Quantity);

impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A version attribute inside CEL: opaque, since `semver` is not provided.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CelVersion(String);

impl Opaque for CelVersion {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

/// A selector that could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CEL selector {expression:?}: {problem}")]
pub struct SelectorError {
    pub expression: String,
    pub problem: String,
}

/// One compiled selector expression.
pub struct Selector {
    expression: String,
    program: Program,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Selector").field(&self.expression).finish()
    }
}

/// Expressions longer than this are refused (`CELSelectorExpressionMaxLength`).
pub const MAX_EXPRESSION_BYTES: usize = 10 * 1024;

impl Selector {
    /// Compiles `expression`; done once per claim, never per device.
    pub fn compile(expression: &str) -> Result<Selector, SelectorError> {
        let err = |problem: String| SelectorError {
            expression: expression.to_string(),
            problem,
        };
        if expression.len() > MAX_EXPRESSION_BYTES {
            return Err(err(format!("longer than {MAX_EXPRESSION_BYTES} bytes")));
        }
        if expression.trim().is_empty() {
            return Err(err("empty expression".into()));
        }
        let program =
            Program::compile(expression).map_err(|e| err(format!("does not parse: {e}")))?;
        Ok(Selector {
            expression: expression.to_string(),
            program,
        })
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Whether `device` matches, in the functions of `env`.
    pub fn matches(&self, env: &Env, device: &DeviceValue) -> Result<bool, SelectorError> {
        let mut scope = env.root.new_inner_scope();
        scope.add_variable_from_value("device", device.0.clone());
        let err = |problem: String| SelectorError {
            expression: self.expression.clone(),
            problem,
        };
        match self.program.execute(&scope) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(err(format!(
                "the result must be a bool, got {}",
                type_name(&other)
            ))),
            Err(ExecutionError::UndeclaredReference(name)) => Err(err(format!(
                "unsupported: {name:?} is not provided by Tessera's CEL evaluator \
                 (supported: device.driver, device.attributes, device.capacity, \
                 device.allowMultipleAllocations, quantity(), compareTo, isGreaterThan, \
                 isLessThan, sign and the CEL standard library; semver() is not)"
            ))),
            Err(ExecutionError::NoSuchKey(key)) => Err(err(format!(
                "the device has no {key:?} (guard with has(...))"
            ))),
            Err(e) => Err(err(e.to_string())),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "int",
        Value::UInt(_) => "uint",
        Value::Float(_) => "double",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::List(_) => "list",
        Value::Map(_) => "map",
        Value::Null => "null",
        _ => "another type",
    }
}

/// The functions selectors may call: the standard library plus Kubernetes'
/// quantity library. Built once per claim.
pub struct Env {
    root: Context<'static, 'static>,
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

fn quantity_of(function: &str, v: &Value) -> Result<Quantity, ExecutionError> {
    match v {
        Value::Opaque(o) => o
            .downcast_ref::<CelQuantity>()
            .map(|q| q.0)
            .ok_or_else(|| ExecutionError::function_error(function, "not a quantity")),
        _ => Err(ExecutionError::function_error(
            function,
            format!("not a quantity: {}", type_name(v)),
        )),
    }
}

fn compare(function: &str, a: &Value, b: &Value) -> Result<Ordering, ExecutionError> {
    Ok(quantity_of(function, a)?.cmp(&quantity_of(function, b)?))
}

impl Env {
    pub fn new() -> Env {
        let mut root = Context::default();
        // Registration only fails on a name the standard library already has:
        // none of these is one (a test checks that every one is callable).
        let _ = root.add_function(
            "quantity",
            |s: Arc<String>| -> Result<Value, ExecutionError> {
                Quantity::parse(&s)
                    .map(|q| Value::Opaque(Arc::new(CelQuantity(q))))
                    .map_err(|e| ExecutionError::function_error("quantity", e))
            },
        );
        let _ = root.add_function(
            "compareTo",
            |This(a): This<Value>, b: Value| -> Result<i64, ExecutionError> {
                Ok(match compare("compareTo", &a, &b)? {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })
            },
        );
        let _ = root.add_function(
            "isGreaterThan",
            |This(a): This<Value>, b: Value| -> Result<bool, ExecutionError> {
                Ok(compare("isGreaterThan", &a, &b)? == Ordering::Greater)
            },
        );
        let _ = root.add_function(
            "isLessThan",
            |This(a): This<Value>, b: Value| -> Result<bool, ExecutionError> {
                Ok(compare("isLessThan", &a, &b)? == Ordering::Less)
            },
        );
        let _ = root.add_function(
            "sign",
            |This(a): This<Value>| -> Result<i64, ExecutionError> {
                Ok(match quantity_of("sign", &a)?.cmp(&Quantity::ZERO) {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })
            },
        );
        Env { root }
    }
}

/// The `device` variable of one device, built once per device.
#[derive(Debug, Clone)]
pub struct DeviceValue(Value);

/// The domain and identifier of a qualified name (`model` of driver `d` is `d`, `model`).
pub fn split_name<'a>(driver: &'a str, name: &'a str) -> (&'a str, &'a str) {
    name.rsplit_once('/').unwrap_or((driver, name))
}

impl DeviceValue {
    pub fn new(
        driver: &str,
        attributes: &BTreeMap<String, AttrValue>,
        capacity: &BTreeMap<String, Quantity>,
        allow_multiple_allocations: bool,
    ) -> DeviceValue {
        let mut attrs: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, v) in attributes {
            let (domain, id) = split_name(driver, name);
            let v = match v {
                AttrValue::Int(i) => Value::Int(*i),
                AttrValue::Bool(b) => Value::Bool(*b),
                AttrValue::String(s) => Value::String(Arc::new(s.clone())),
                AttrValue::Version(s) => Value::Opaque(Arc::new(CelVersion(s.clone()))),
            };
            attrs
                .entry(domain.to_string())
                .or_default()
                .insert(id.to_string(), v);
        }
        let mut caps: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, q) in capacity {
            let (domain, id) = split_name(driver, name);
            caps.entry(domain.to_string())
                .or_default()
                .insert(id.to_string(), Value::Opaque(Arc::new(CelQuantity(*q))));
        }
        let group = |m: HashMap<String, HashMap<String, Value>>| -> Value {
            let m: HashMap<String, Value> = m
                .into_iter()
                .map(|(k, v)| (k, Value::Map(v.into())))
                .collect();
            Value::Map(m.into())
        };
        let mut device: HashMap<String, Value> = HashMap::new();
        device.insert("driver".into(), Value::String(Arc::new(driver.to_string())));
        device.insert("attributes".into(), group(attrs));
        device.insert("capacity".into(), group(caps));
        device.insert(
            "allowMultipleAllocations".into(),
            Value::Bool(allow_multiple_allocations),
        );
        DeviceValue(Value::Map(device.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "gpu.tessera.io";

    fn h100(index: i64, memory: &str) -> DeviceValue {
        let attributes = BTreeMap::from([
            ("type".to_string(), AttrValue::String("gpu".into())),
            ("model".to_string(), AttrValue::String("H100-80GB".into())),
            ("index".to_string(), AttrValue::Int(index)),
            ("numa".to_string(), AttrValue::Int(0)),
            (
                "driverVersion".to_string(),
                AttrValue::Version("535.104.5".into()),
            ),
            (
                "resource.kubernetes.io/pciBusID".to_string(),
                AttrValue::String("0000:07:00.0".into()),
            ),
        ]);
        let capacity = BTreeMap::from([("memory".to_string(), Quantity::parse(memory).unwrap())]);
        DeviceValue::new(D, &attributes, &capacity, false)
    }

    fn eval(expr: &str, d: &DeviceValue) -> Result<bool, SelectorError> {
        Selector::compile(expr)?.matches(&Env::new(), d)
    }

    /// Table test: each expression against an 80 GiB H100 (`index` 3) and a
    /// 20 GiB one (`index` 1). The pairs differ where the expression reads
    /// what differs, so a selector that ignores its input would fail here.
    #[test]
    fn the_supported_subset_evaluates_as_kubernetes_does() {
        let big = h100(3, "80Gi");
        let small = h100(1, "20Gi");
        let cases: &[(&str, bool, bool)] = &[
            (r#"device.driver == "gpu.tessera.io""#, true, true),
            (r#"device.driver == "gpu.nvidia.com""#, false, false),
            (
                r#"device.attributes["gpu.tessera.io"].model == "H100-80GB""#,
                true,
                true,
            ),
            (
                r#"device.attributes["gpu.tessera.io"].type == "mig""#,
                false,
                false,
            ),
            (
                r#"device.attributes["gpu.tessera.io"].index == 3"#,
                true,
                false,
            ),
            (
                r#"device.attributes["gpu.tessera.io"].index in [1, 2]"#,
                false,
                true,
            ),
            (
                r#"device.capacity["gpu.tessera.io"].memory.compareTo(quantity("40Gi")) >= 0"#,
                true,
                false,
            ),
            (
                r#"device.capacity["gpu.tessera.io"].memory.isGreaterThan(quantity("20Gi"))"#,
                true,
                false,
            ),
            (
                r#"device.capacity["gpu.tessera.io"].memory.isLessThan(quantity("81920Mi"))"#,
                false,
                true,
            ),
            (
                r#"device.capacity["gpu.tessera.io"].memory.compareTo(quantity("20480Mi")) == 0"#,
                false,
                true,
            ),
            (
                r#"device.attributes["gpu.tessera.io"].index > 2 || device.attributes["gpu.tessera.io"].numa == 1"#,
                true,
                false,
            ),
            (
                r#"!(device.attributes["gpu.tessera.io"].index == 3) && device.driver == "gpu.tessera.io""#,
                false,
                true,
            ),
            (
                r#"device.attributes["resource.kubernetes.io"].pciBusID == "0000:07:00.0""#,
                true,
                true,
            ),
            (
                r#"has(device.attributes["gpu.tessera.io"].uuid)"#,
                false,
                false,
            ),
            (r#"device.allowMultipleAllocations"#, false, false),
            (
                r#"device.capacity["gpu.tessera.io"].memory.sign() == 1"#,
                true,
                true,
            ),
        ];
        for (expr, want_big, want_small) in cases {
            assert_eq!(eval(expr, &big), Ok(*want_big), "{expr} on the 80 GiB GPU");
            assert_eq!(
                eval(expr, &small),
                Ok(*want_small),
                "{expr} on the 20 GiB GPU"
            );
        }
    }

    /// Outside the subset, or wrong for the device: an error naming the
    /// expression and the part at fault, never a match or a non-match.
    #[test]
    fn errors_name_the_expression_and_the_problem() {
        let d = h100(0, "80Gi");
        let cases: &[(&str, &str)] = &[
            (
                r#"device.attributes["gpu.tessera.io"].driverVersion.isGreaterThan(semver("1.0.0"))"#,
                "\"semver\"",
            ),
            (
                r#"device.attributes["gpu.tessera.io"].nope == 1"#,
                "\"nope\"",
            ),
            (
                r#"device.attributes["gpu.tessera.io"].model"#,
                "must be a bool, got string",
            ),
            (r#"device.driver == "#, "does not parse"),
            ("", "empty"),
            (r#"quantity("12 Gi").sign() == 1"#, "not a quantity"),
            (
                r#"device.attributes["gpu.tessera.io"].index.compareTo(quantity("1")) == 0"#,
                "not a quantity",
            ),
        ];
        for (expr, part) in cases {
            let e = eval(expr, &d).expect_err(expr);
            assert_eq!(e.expression, *expr);
            assert!(e.to_string().contains(part), "{expr}: {e}");
        }
        let long = "true || ".repeat(2000) + "true";
        assert!(
            Selector::compile(&long)
                .unwrap_err()
                .problem
                .contains("longer")
        );
    }
}
