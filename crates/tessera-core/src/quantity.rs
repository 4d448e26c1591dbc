//! `resource.Quantity` as an exact number, for DRA capacities.
//!
//! Device capacities (`memory: 81920Mi`, `compute: "1000"`), capacity requests
//! and `consumedCapacity` are quantities that the allocator adds, compares and
//! rounds to a request policy's steps. Floating point would let `3 × 1/3` of a
//! GPU exceed the whole, so a quantity is held as an integer count of nano-units
//! (`1 = 10⁻⁹`), wide enough (`i128`) for exabytes. Like the API server, a value
//! finer than a nano-unit rounds up.

use std::fmt;

/// An exact quantity in nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    nano: i128,
}

/// A quantity string that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a quantity: {problem}")]
pub struct QuantityError {
    pub value: String,
    pub problem: &'static str,
}

const NANO: i128 = 1_000_000_000;

impl Quantity {
    pub const ZERO: Quantity = Quantity { nano: 0 };

    /// A whole number of units.
    pub fn from_units(units: i64) -> Quantity {
        Quantity {
            nano: i128::from(units) * NANO,
        }
    }

    /// A quantity of `nano` nano-units.
    pub fn from_nano(nano: i128) -> Quantity {
        Quantity { nano }
    }

    /// The value in nano-units.
    pub fn nano(self) -> i128 {
        self.nano
    }

    /// Parses the API's serialization: `[+-]digits[.digits]` then one of the
    /// binary suffixes (`Ki`…`Ei`), the decimal SI suffixes (`n u m k M G T P E`)
    /// or a decimal exponent (`e3`, `E-2`).
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let err = |problem| QuantityError {
            value: s.to_string(),
            problem,
        };
        let t = s.trim();
        let (negative, t) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, suffix) = t.split_at(end);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err("no digits"));
        }
        if frac_part.contains('.') {
            return Err(err("more than one decimal point"));
        }
        // (multiplier, power of ten) of the suffix.
        let (mult, exp10): (i128, i32) = match suffix {
            "" => (1, 0),
            "Ki" => (1 << 10, 0),
            "Mi" => (1 << 20, 0),
            "Gi" => (1 << 30, 0),
            "Ti" => (1 << 40, 0),
            "Pi" => (1 << 50, 0),
            "Ei" => (1 << 60, 0),
            "n" => (1, -9),
            "u" => (1, -6),
            "m" => (1, -3),
            "k" => (1, 3),
            "M" => (1, 6),
            "G" => (1, 9),
            "T" => (1, 12),
            "P" => (1, 15),
            "E" => (1, 18),
            s if s.starts_with(['e', 'E']) => {
                let e: i32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
                if !(-30..=30).contains(&e) {
                    return Err(err("exponent out of range"));
                }
                (1, e)
            }
            _ => return Err(err("unknown suffix")),
        };
        // digits as one integer, scaled by 10^-(fraction digits).
        let digits: String = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(err("too many digits"));
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| err("bad digits"))?
        };
        // nano = mantissa · mult · 10^(exp10 + 9 − frac_len), rounded up.
        let shift = exp10 + 9 - frac_part.len() as i32;
        let scaled = mantissa.checked_mul(mult).ok_or_else(|| err("too large"))?;
        let nano = if shift >= 0 {
            10i128
                .checked_pow(shift as u32)
                .and_then(|p| scaled.checked_mul(p))
                .ok_or_else(|| err("too large"))?
        } else {
            let p = 10i128
                .checked_pow((-shift) as u32)
                .ok_or_else(|| err("too precise"))?;
            // Round away from zero: the API server rounds up what it cannot hold.
            scaled / p + i128::from(scaled % p != 0)
        };
        Ok(Quantity {
            nano: if negative { -nano } else { nano },
        })
    }

    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nano
            .checked_add(other.nano)
            .map(|nano| Quantity { nano })
    }

    pub fn saturating_sub(self, other: Quantity) -> Quantity {
        Quantity {
            nano: self.nano.saturating_sub(other.nano),
        }
    }

    /// The value in whole units, rounded up (`500m` → 1).
    pub fn ceil_units(self) -> i128 {
        self.nano.div_euclid(NANO) + i128::from(self.nano.rem_euclid(NANO) != 0)
    }
}

/// The canonical text: the largest binary suffix that divides it exactly
/// (`80Gi`), else whole units, else milli- or nano-units.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.nano;
        if n % NANO == 0 {
            let units = n / NANO;
            if units != 0 {
                for (suffix, shift) in [
                    ("Ei", 60),
                    ("Pi", 50),
                    ("Ti", 40),
                    ("Gi", 30),
                    ("Mi", 20),
                    ("Ki", 10),
                ] {
                    if units % (1i128 << shift) == 0 {
                        return write!(f, "{}{suffix}", units >> shift);
                    }
                }
            }
            write!(f, "{units}")
        } else if n % 1_000_000 == 0 {
            write!(f, "{}m", n / 1_000_000)
        } else {
            write!(f, "{n}n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn parses_the_api_forms() {
        let cases: [(&str, i128); 12] = [
            ("1", NANO),
            ("80Gi", 80 * (1 << 30) * NANO),
            ("81920Mi", 80 * (1 << 30) * NANO),
            ("1000", 1000 * NANO),
            ("500m", NANO / 2),
            ("1.5", 3 * NANO / 2),
            ("1.5Gi", 3 * (1 << 29) * NANO),
            ("2k", 2000 * NANO),
            ("1e3", 1000 * NANO),
            ("1E-3", NANO / 1000),
            ("-2", -2 * NANO),
            // 0.1n is finer than the representation: rounds up to 1n.
            ("0.1n", 1),
        ];
        for (s, nano) in cases {
            assert_eq!(q(s).nano(), nano, "{s}");
        }
        assert_eq!(q("40Gi"), q("40960Mi"));
        assert!(q("40Gi") < q("41Gi"));
    }

    #[test]
    fn refuses_what_is_not_a_quantity() {
        for s in [
            "",
            "Gi",
            "1.2.3",
            "1Xi",
            "1e99",
            "12 Gi",
            "abc",
            "1234567890123456789012345678901",
        ] {
            let e = Quantity::parse(s).unwrap_err();
            assert_eq!(e.value, s);
        }
    }

    #[test]
    fn prints_canonically_and_round_trips() {
        for (s, want) in [
            ("80Gi", "80Gi"),
            ("81920Mi", "80Gi"),
            ("1000", "1000"),
            ("1024", "1Ki"),
            ("500m", "500m"),
            ("0", "0"),
            ("20Mi", "20Mi"),
        ] {
            assert_eq!(q(s).to_string(), want, "{s}");
            assert_eq!(q(&q(s).to_string()), q(s));
        }
        assert_eq!(q("500m").ceil_units(), 1);
        assert_eq!(q("2").ceil_units(), 2);
    }
}
