//! The attribute's options: `name = "..."`, `category = "..."`, `args(...)` / `fields(...)`,
//! `crate = path`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{token, Error, Expr, Ident, LitStr, Path, Result, Token};

/// What `#[instrument(...)]` was given.
#[derive(Default)]
pub(crate) struct Options {
    /// `name = "..."`.
    pub(crate) name: Option<LitStr>,
    /// `category = "..."`.
    pub(crate) category: Option<LitStr>,
    /// `args(...)` or `fields(...)`, in order.
    pub(crate) args: Vec<Arg>,
    /// `crate = path`.
    pub(crate) krate: Option<Path>,
}

/// One item of `args(...)`.
pub(crate) struct Arg {
    /// The argument's name in the trace.
    pub(crate) key: String,
    /// Where the key was written.
    pub(crate) span: Span,
    /// `key = expr` or `"key" = expr`: the value; `None` for a bare parameter name.
    pub(crate) value: Option<Expr>,
    /// For a bare name: the parameter (the value recorded).
    pub(crate) param: Option<Ident>,
}

impl Arg {
    /// The expression recorded.
    pub(crate) fn value_tokens(&self) -> proc_macro2::TokenStream {
        match (&self.value, &self.param) {
            (Some(expr), _) => quote::quote!(#expr),
            (None, Some(param)) => quote::quote!(#param),
            (None, None) => unreachable!("an argument has a value or names a parameter"),
        }
    }
}

const OPTIONS: &str =
    "expected `name = \"...\"`, `category = \"...\"`, `args(...)`, `fields(...)` or `crate = path`";

impl Parse for Options {
    fn parse(input: ParseStream<'_>) -> Result<Self> {
        let mut options = Options::default();
        let mut args_seen: Option<Ident> = None;
        while !input.is_empty() {
            let key = if input.peek(Ident::peek_any) {
                input.call(Ident::parse_any)?
            } else {
                return Err(input.error(OPTIONS));
            };
            match key.unraw().to_string().as_str() {
                "name" => {
                    let lit = string_value(input, &key)?;
                    set_once(&mut options.name, &key, lit)?;
                }
                "category" => {
                    let lit = string_value(input, &key)?;
                    set_once(&mut options.category, &key, lit)?;
                }
                "args" | "fields" => {
                    if let Some(first) = &args_seen {
                        return Err(Error::new(
                            key.span(),
                            format!("`{key}` after `{first}`: list every argument in one `{first}(...)`"),
                        ));
                    }
                    if !input.peek(token::Paren) {
                        return Err(Error::new(
                            key.span(),
                            format!("expected `{key}(a, b, key = expr, ...)`"),
                        ));
                    }
                    let content;
                    syn::parenthesized!(content in input);
                    let list = Punctuated::<Arg, Token![,]>::parse_terminated(&content)?;
                    for arg in list {
                        if let Some(prev) = options.args.iter().find(|a| a.key == arg.key) {
                            let mut err = Error::new(
                                arg.span,
                                format!("argument `{}` is recorded twice", arg.key),
                            );
                            err.combine(Error::new(prev.span, "first recorded here"));
                            return Err(err);
                        }
                        options.args.push(arg);
                    }
                    args_seen = Some(key);
                }
                "crate" => {
                    input.parse::<Token![=]>().map_err(|_| {
                        Error::new(
                            key.span(),
                            "expected `crate = path` (e.g. `crate = ::my_tachyon`)",
                        )
                    })?;
                    let path = input.call(Path::parse_mod_style)?;
                    set_once(&mut options.krate, &key, path)?;
                }
                _ => {
                    return Err(Error::new(
                        key.span(),
                        format!("unknown option `{key}`: {OPTIONS}"),
                    ))
                }
            }
            if input.is_empty() {
                break;
            }
            input
                .parse::<Token![,]>()
                .map_err(|e| Error::new(e.span(), "expected `,` between options"))?;
        }
        Ok(options)
    }
}

/// `= "text"` after `key`: a non-empty string literal.
fn string_value(input: ParseStream<'_>, key: &Ident) -> Result<LitStr> {
    if !input.peek(Token![=]) {
        return Err(Error::new(
            key.span(),
            format!("expected `{key} = \"...\"`"),
        ));
    }
    input.parse::<Token![=]>()?;
    if !input.peek(LitStr) {
        return Err(input.error(format!("`{key}` takes a string literal: `{key} = \"...\"`")));
    }
    let lit: LitStr = input.parse()?;
    if lit.value().is_empty() {
        return Err(Error::new(
            lit.span(),
            format!("`{key}` must not be empty (leave the option out for the default)"),
        ));
    }
    Ok(lit)
}

/// Stores an option given once; a repeat is an error at the repeated key.
fn set_once<T>(slot: &mut Option<T>, key: &Ident, value: T) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new(key.span(), format!("`{key}` is given twice")));
    }
    *slot = Some(value);
    Ok(())
}

impl Parse for Arg {
    fn parse(input: ParseStream<'_>) -> Result<Self> {
        if input.peek(LitStr) {
            let key: LitStr = input.parse()?;
            if key.value().is_empty() {
                return Err(Error::new(
                    key.span(),
                    "an argument's name must not be empty",
                ));
            }
            if !input.peek(Token![=]) {
                return Err(Error::new(
                    key.span(),
                    "a quoted argument name needs a value: `\"key\" = expr`",
                ));
            }
            input.parse::<Token![=]>()?;
            return Ok(Arg {
                key: key.value(),
                span: key.span(),
                value: Some(input.parse()?),
                param: None,
            });
        }
        if !input.peek(Ident::peek_any) {
            return Err(input.error("expected a parameter name, `key = expr` or `\"key\" = expr`"));
        }
        let ident = input.call(Ident::parse_any)?;
        let key = ident.unraw().to_string();
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            return Ok(Arg {
                key,
                span: ident.span(),
                value: Some(input.parse()?),
                param: None,
            });
        }
        if ident == "self" {
            return Err(Error::new(
                ident.span(),
                "`self` cannot be recorded as a whole: record what you need, e.g. `id = self.id`",
            ));
        }
        Ok(Arg {
            key,
            span: ident.span(),
            value: None,
            param: Some(ident),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Options {
        match syn::parse_str::<Options>(s) {
            Ok(o) => o,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn error(s: &str) -> String {
        match syn::parse_str::<Options>(s) {
            Ok(_) => panic!("{s:?} should not parse"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty() {
        let o = parse("");
        assert!(o.name.is_none() && o.category.is_none() && o.krate.is_none());
        assert!(o.args.is_empty());
    }

    #[test]
    fn every_option() {
        let o = parse(
            r#"name = "custom", category = "io", args(x, r#type, len = v.len(), "a.b" = 1), crate = ::t2,"#,
        );
        assert_eq!(o.name.unwrap().value(), "custom");
        assert_eq!(o.category.unwrap().value(), "io");
        let keys: Vec<&str> = o.args.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["x", "type", "len", "a.b"]);
        assert_eq!(o.args[0].value_tokens().to_string(), "x");
        assert_eq!(o.args[1].value_tokens().to_string(), "r#type");
        assert_eq!(o.args[2].value_tokens().to_string(), "v . len ()");
        assert!(o.args[2].param.is_none());
        let krate = o.krate.unwrap();
        assert!(krate.leading_colon.is_some());
        assert_eq!(krate.segments[0].ident, "t2");
    }

    #[test]
    fn fields_is_args() {
        let o = parse("fields(a, b,)");
        let keys: Vec<&str> = o.args.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(parse("args()").args.len(), 0);
    }

    #[test]
    fn crate_path() {
        let o = parse("crate = crate");
        assert_eq!(o.krate.unwrap().segments[0].ident, "crate");
        let o = parse("crate = deps::tachyon");
        assert_eq!(o.krate.unwrap().segments.len(), 2);
    }

    #[test]
    fn errors() {
        let cases = [
            ("nme = \"x\"", "unknown option `nme`"),
            ("name", "expected `name = \"...\"`"),
            ("name = x", "`name` takes a string literal"),
            ("name = 3", "`name` takes a string literal"),
            ("name = \"\"", "`name` must not be empty"),
            ("category = \"\"", "`category` must not be empty"),
            ("name = \"a\", name = \"b\"", "`name` is given twice"),
            (
                "category = \"a\", category = \"b\"",
                "`category` is given twice",
            ),
            (
                "name = \"a\" category = \"b\"",
                "expected `,` between options",
            ),
            ("args", "expected `args(a, b, key = expr, ...)`"),
            ("fields = 3", "expected `fields(a, b, key = expr, ...)`"),
            ("args(a), fields(b)", "`fields` after `args`"),
            ("args(a, a)", "argument `a` is recorded twice"),
            ("args(a, a = 1)", "argument `a` is recorded twice"),
            ("args(self)", "`self` cannot be recorded as a whole"),
            ("args(\"k\")", "a quoted argument name needs a value"),
            ("args(\"\" = 1)", "an argument's name must not be empty"),
            ("args(3)", "expected a parameter name"),
            ("args(a = )", "expected an expression"),
            ("crate", "expected `crate = path`"),
            ("\"x\"", "expected `name = \"...\"`, `category"),
        ];
        for (input, want) in cases {
            let got = error(input);
            assert!(got.contains(want), "{input:?}: got {got:?}, want {want:?}");
        }
    }
}
