//! Attribute constraints of a job (`constraints:` in its spec), as Marathon and Nomad have
//! them: the jobs framework's rule, not the master's (the master matches no attributes, it
//! only keeps a framework to its partition). The one place that says whether an agent
//! satisfies a job's constraints: the engine ([`super::engine::Engine::place`]) asks it for
//! each offer, `job plan` (the master's placer) for each agent.
//!
//! An agent is seen through its hostname and its attributes (`--attributes` of the agent):
//! the attribute `hostname` is the hostname, every other name is looked up in the attributes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a constraint compares an attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    /// The attribute is set and equals the value.
    #[serde(rename = "=")]
    Eq,
    /// The attribute is not set, or differs from the value.
    #[serde(rename = "!=")]
    Ne,
    /// The attribute is set and the whole of it matches the regular expression.
    #[serde(rename = "regexp")]
    Regexp,
    /// The attribute is set (any value).
    #[serde(rename = "is_set")]
    IsSet,
    /// The attribute is not set.
    #[serde(rename = "is_not_set")]
    IsNotSet,
    /// No two live instances of the job on one agent (no attribute, no value).
    #[serde(rename = "distinct_hosts")]
    DistinctHosts,
}

/// The operators as the spec spells them, for errors.
pub const OPERATORS: &str = "=, !=, regexp, is_set, is_not_set, distinct_hosts";

impl Operator {
    pub fn parse(text: &str) -> Option<Operator> {
        Some(match text {
            "=" | "==" => Operator::Eq,
            "!=" => Operator::Ne,
            "regexp" => Operator::Regexp,
            "is_set" => Operator::IsSet,
            "is_not_set" => Operator::IsNotSet,
            "distinct_hosts" => Operator::DistinctHosts,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Eq => "=",
            Operator::Ne => "!=",
            Operator::Regexp => "regexp",
            Operator::IsSet => "is_set",
            Operator::IsNotSet => "is_not_set",
            Operator::DistinctHosts => "distinct_hosts",
        }
    }

    /// Whether the operator compares against a value.
    pub fn takes_value(self) -> bool {
        matches!(self, Operator::Eq | Operator::Ne | Operator::Regexp)
    }

    /// Whether the operator names an attribute.
    pub fn takes_attribute(self) -> bool {
        self != Operator::DistinctHosts
    }
}

/// One checked constraint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Constraint {
    /// Empty for `distinct_hosts`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attribute: String,
    pub operator: Operator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl fmt::Display for Constraint {
    /// `rack = r1`, `gpu is_set`, `distinct_hosts`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.operator, &self.value) {
            (Operator::DistinctHosts, _) => f.write_str("distinct_hosts"),
            (op, Some(value)) => write!(f, "{} {} {}", self.attribute, op.as_str(), value),
            (op, None) => write!(f, "{} {}", self.attribute, op.as_str()),
        }
    }
}

/// Why a constraint is malformed: the key at fault (`attribute`, `operator`, `value`) and why.
pub type Problem = (&'static str, String);

impl Constraint {
    /// Checks a constraint read from a file or from JSON.
    pub fn check(&self) -> Result<(), Problem> {
        let op = self.operator;
        if op.takes_attribute() {
            if self.attribute.is_empty() {
                return Err((
                    "attribute",
                    format!("operator {} needs an attribute", op.as_str()),
                ));
            }
            if self
                .attribute
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == ';' || c == ':')
            {
                return Err((
                    "attribute",
                    format!("`{}` is not an attribute name", self.attribute),
                ));
            }
        } else if !self.attribute.is_empty() {
            return Err((
                "attribute",
                format!("operator {} takes no attribute", op.as_str()),
            ));
        }
        match (&self.value, op.takes_value()) {
            (None, true) => Err(("value", format!("operator {} needs a value", op.as_str()))),
            (Some(_), false) => Err(("value", format!("operator {} takes no value", op.as_str()))),
            (Some(pattern), true) if op == Operator::Regexp => {
                compile(pattern).map(|_| ()).map_err(|e| {
                    (
                        "value",
                        format!("`{pattern}` is not a regular expression: {e}"),
                    )
                })
            }
            _ => Ok(()),
        }
    }
}

fn compile(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
}

/// An agent as constraints see it.
#[derive(Clone, Copy, Debug)]
pub struct AgentFacts<'a> {
    pub hostname: &'a str,
    pub attributes: &'a [(String, String)],
}

impl AgentFacts<'_> {
    /// The attribute `name`: `hostname` is the agent's hostname (unset when empty).
    pub fn get(&self, name: &str) -> Option<&str> {
        if name == "hostname" {
            return (!self.hostname.is_empty()).then_some(self.hostname);
        }
        self.attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A job's constraints ready to match agents (regular expressions compiled once).
pub struct Matcher<'c> {
    rules: Vec<(&'c Constraint, Option<regex::Regex>)>,
    distinct_hosts: bool,
}

impl<'c> Matcher<'c> {
    /// The constraints were checked when the spec was read; a bad regular expression that
    /// slipped through matches nothing.
    pub fn new(constraints: &'c [Constraint]) -> Self {
        let rules = constraints
            .iter()
            .filter(|c| c.operator != Operator::DistinctHosts)
            .map(|c| {
                let re = (c.operator == Operator::Regexp)
                    .then(|| c.value.as_deref().and_then(|p| compile(p).ok()))
                    .flatten();
                (c, re)
            })
            .collect();
        Matcher {
            rules,
            distinct_hosts: constraints
                .iter()
                .any(|c| c.operator == Operator::DistinctHosts),
        }
    }

    /// Whether the job wants no two live instances on one agent.
    pub fn distinct_hosts(&self) -> bool {
        self.distinct_hosts
    }

    /// The first attribute constraint the agent does not satisfy (`None`: it satisfies all;
    /// `distinct_hosts` is the caller's, which knows where the instances are).
    pub fn unmet(&self, agent: &AgentFacts<'_>) -> Option<&'c Constraint> {
        self.rules
            .iter()
            .find(|(c, re)| !satisfies(c, re.as_ref(), agent))
            .map(|(c, _)| *c)
    }

    pub fn matches(&self, agent: &AgentFacts<'_>) -> bool {
        self.unmet(agent).is_none()
    }

    /// Why none of `agents` can hold an instance, for people: `no agent satisfies rack = r1`
    /// (the first constraint no agent satisfies), else `no agent satisfies all of: a, b`.
    /// `None` when some agent satisfies every constraint.
    pub fn why_none<'a>(&self, agents: impl IntoIterator<Item = AgentFacts<'a>>) -> Option<String> {
        let agents: Vec<AgentFacts<'a>> = agents.into_iter().collect();
        if self.rules.is_empty() || agents.iter().any(|a| self.matches(a)) {
            return None;
        }
        if agents.is_empty() {
            return Some("no connected agent in the job's partition".into());
        }
        let lone = self
            .rules
            .iter()
            .find(|(c, re)| !agents.iter().any(|a| satisfies(c, re.as_ref(), a)));
        Some(match lone {
            Some((c, _)) => format!("no agent satisfies {c}"),
            None => format!(
                "no agent satisfies all of: {}",
                self.rules
                    .iter()
                    .map(|(c, _)| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }
}

fn satisfies(c: &Constraint, re: Option<&regex::Regex>, agent: &AgentFacts<'_>) -> bool {
    let have = agent.get(&c.attribute);
    match c.operator {
        Operator::Eq => have.is_some() && have == c.value.as_deref(),
        Operator::Ne => have != c.value.as_deref(),
        Operator::Regexp => match (have, re) {
            (Some(v), Some(re)) => re.is_match(v),
            _ => false,
        },
        Operator::IsSet => have.is_some(),
        Operator::IsNotSet => have.is_none(),
        Operator::DistinctHosts => true,
    }
}

/// Checks a list of constraints; `Err((index, key, message))`.
pub fn check_all(constraints: &[Constraint]) -> Result<(), (usize, &'static str, String)> {
    for (i, c) in constraints.iter().enumerate() {
        c.check().map_err(|(key, e)| (i, key, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(attribute: &str, op: Operator, value: Option<&str>) -> Constraint {
        Constraint {
            attribute: attribute.into(),
            operator: op,
            value: value.map(String::from),
        }
    }

    fn attrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn each_operator_matches_as_documented() {
        let a = attrs(&[("rack", "r1"), ("zone", "eu-west-1a")]);
        let agent = AgentFacts {
            hostname: "node7",
            attributes: &a,
        };
        let bare = AgentFacts {
            hostname: "",
            attributes: &[],
        };
        let cases = [
            (c("rack", Operator::Eq, Some("r1")), true, false),
            (c("rack", Operator::Eq, Some("r2")), false, false),
            (c("rack", Operator::Ne, Some("r2")), true, true),
            (c("rack", Operator::Ne, Some("r1")), false, true),
            (c("zone", Operator::Regexp, Some("eu-.*")), true, false),
            (c("zone", Operator::Regexp, Some("west")), false, false),
            (c("rack", Operator::IsSet, None), true, false),
            (c("rack", Operator::IsNotSet, None), false, true),
            (c("hostname", Operator::Eq, Some("node7")), true, false),
            (
                c("hostname", Operator::Regexp, Some("node[0-9]+")),
                true,
                false,
            ),
            (c("hostname", Operator::IsSet, None), true, false),
        ];
        for (constraint, on_agent, on_bare) in cases {
            let list = [constraint.clone()];
            let m = Matcher::new(&list);
            assert_eq!(m.matches(&agent), on_agent, "{constraint} on agent");
            assert_eq!(m.matches(&bare), on_bare, "{constraint} on bare");
            assert!(constraint.check().is_ok(), "{constraint}");
        }
    }

    #[test]
    fn all_constraints_must_hold_and_the_first_unmet_is_named() {
        let list = [
            c("rack", Operator::Eq, Some("r1")),
            c("gpu", Operator::IsSet, None),
            c("", Operator::DistinctHosts, None),
        ];
        let m = Matcher::new(&list);
        assert!(m.distinct_hosts());
        let r1 = attrs(&[("rack", "r1")]);
        let r1_gpu = attrs(&[("rack", "r1"), ("gpu", "a100")]);
        let r2_gpu = attrs(&[("rack", "r2"), ("gpu", "a100")]);
        let a = |attributes| AgentFacts {
            hostname: "h",
            attributes,
        };
        assert_eq!(m.unmet(&a(&r1)).unwrap().to_string(), "gpu is_set");
        assert!(m.matches(&a(&r1_gpu)));
        assert_eq!(m.why_none([a(&r1_gpu), a(&r2_gpu)]), None);
        assert_eq!(
            m.why_none([a(&r2_gpu)]).unwrap(),
            "no agent satisfies rack = r1"
        );
        assert_eq!(
            m.why_none([a(&r1), a(&r2_gpu)]).unwrap(),
            "no agent satisfies all of: rack = r1, gpu is_set"
        );
    }

    #[test]
    fn malformed_constraints_name_the_key() {
        let bad = [
            (c("rack", Operator::Eq, None), "value"),
            (c("rack", Operator::IsSet, Some("x")), "value"),
            (c("", Operator::Eq, Some("x")), "attribute"),
            (c("rack", Operator::DistinctHosts, None), "attribute"),
            (c("rack", Operator::Regexp, Some("(")), "value"),
            (c("a b", Operator::IsSet, None), "attribute"),
        ];
        for (constraint, key) in bad {
            assert_eq!(constraint.check().unwrap_err().0, key, "{constraint:?}");
        }
        assert!(c("", Operator::DistinctHosts, None).check().is_ok());
        assert_eq!(Operator::parse("=="), Some(Operator::Eq));
        assert_eq!(Operator::parse("like"), None);
    }

    #[test]
    fn constraints_round_trip_as_json() {
        let list = vec![
            c("rack", Operator::Ne, Some("r1")),
            c("", Operator::DistinctHosts, None),
        ];
        let json = serde_json::to_string(&list).unwrap();
        assert_eq!(
            json,
            r#"[{"attribute":"rack","operator":"!=","value":"r1"},{"operator":"distinct_hosts"}]"#
        );
        assert_eq!(
            serde_json::from_str::<Vec<Constraint>>(&json).unwrap(),
            list
        );
    }
}
