//! `#[instrument]`'s expansion: the function as written, with a zone guard as the first
//! statement of its body.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::ext::IdentExt;
use syn::{Error, FnArg, Ident, Item, ItemFn, LitStr, Pat, Result, Stmt, TraitItemFn};

use crate::options::Options;

/// The local holding the zone's guard: it drops (ending the zone) when the function returns.
const GUARD: &str = "__tachyon_zone";

/// Expands `#[instrument(attr)] item`. On an error, the item is passed through unchanged
/// beside the error, so that the one error is all the compiler reports.
pub(crate) fn instrument(attr: TokenStream, item: TokenStream) -> TokenStream {
    match try_instrument(attr, item.clone()) {
        Ok(tokens) => tokens,
        Err(err) => {
            let err = err.to_compile_error();
            quote!(#err #item)
        }
    }
}

fn try_instrument(attr: TokenStream, item: TokenStream) -> Result<TokenStream> {
    let options: Options = syn::parse2(attr)?;
    let mut func = parse_fn(item)?;
    let sig = &func.sig;
    if let Some(asyncness) = &sig.asyncness {
        return Err(Error::new_spanned(
            asyncness,
            "`#[tachyon::instrument]` does not support `async fn`: a zone is a slice on the \
             thread's track, and one held across `.await` would contain whatever else the \
             thread runs while the future waits, and end on whichever thread resumes it. \
             Instrument the synchronous functions the future calls, or record the operation \
             on its own track (`tachyon::Track::new_async` and `tachyon::begin!`), whose \
             slices may end on any thread",
        ));
    }
    if let Some(constness) = &sig.constness {
        return Err(Error::new_spanned(
            constness,
            "`#[tachyon::instrument]` does not support `const fn`: zones are recorded at run \
             time",
        ));
    }
    check_params(&func, &options)?;

    let krate = match &options.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::tachyon),
    };
    let name = match &options.name {
        Some(name) => name.clone(),
        None => LitStr::new(&sig.ident.unraw().to_string(), sig.ident.span()),
    };
    let category = options.category.as_ref().map(|c| quote!(#c,));
    let args = options.args.iter().map(|arg| {
        let key = LitStr::new(&arg.key, arg.span);
        let value = arg.value_tokens();
        quote!(, #key = #value)
    });
    let guard = Ident::new(GUARD, Span::call_site());
    let stmt: Stmt = syn::parse_quote! {
        let #guard = #krate::zone!(#category #name #(#args)*);
    };
    func.block.stmts.insert(0, stmt);
    Ok(func.into_token_stream())
}

/// The function, or an error saying why the item is not one `#[instrument]` takes.
fn parse_fn(item: TokenStream) -> Result<ItemFn> {
    let err = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => return Ok(func),
        Err(err) => err,
    };
    if let Ok(decl) = syn::parse2::<TraitItemFn>(item.clone()) {
        if decl.default.is_none() {
            return Err(Error::new_spanned(
                &decl.sig,
                "`#[tachyon::instrument]` needs a function body: put it on the functions that \
                 implement this declaration",
            ));
        }
    }
    match syn::parse2::<Item>(item) {
        Ok(Item::Fn(_)) | Err(_) => Err(err),
        Ok(other) => Err(Error::new_spanned(
            other,
            "`#[tachyon::instrument]` applies to functions (free functions and methods)",
        )),
    }
}

/// Each bare name in `args(...)` must be a parameter (or bound by a parameter's pattern).
fn check_params(func: &ItemFn, options: &Options) -> Result<()> {
    let mut bound = Vec::new();
    let mut complete = true;
    for input in &func.sig.inputs {
        if let FnArg::Typed(typed) = input {
            complete &= bindings(&typed.pat, &mut bound);
        }
    }
    if !complete {
        // A pattern this check does not understand (a macro, new syntax): leave unknown names
        // to the compiler.
        return Ok(());
    }
    for arg in &options.args {
        let Some(param) = &arg.param else { continue };
        if !bound.contains(&param) {
            return Err(Error::new(
                param.span(),
                format!(
                    "`{}` has no parameter `{param}`: record an expression with \
                     `{param} = expr`",
                    func.sig.ident
                ),
            ));
        }
    }
    Ok(())
}

/// Collects the names `pat` binds; `false` if it has a part this does not understand.
fn bindings<'a>(pat: &'a Pat, out: &mut Vec<&'a Ident>) -> bool {
    match pat {
        Pat::Ident(p) => {
            out.push(&p.ident);
            p.subpat.as_ref().is_none_or(|(_, sub)| bindings(sub, out))
        }
        Pat::Tuple(p) => p.elems.iter().all(|e| bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().all(|e| bindings(e, out)),
        Pat::Slice(p) => p.elems.iter().all(|e| bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().all(|f| bindings(&f.pat, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        Pat::Or(p) => p.cases.iter().all(|c| bindings(c, out)),
        Pat::Wild(_)
        | Pat::Rest(_)
        | Pat::Lit(_)
        | Pat::Path(_)
        | Pat::Range(_)
        | Pat::Const(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion of `#[instrument(attr)] item`, as a string.
    fn expand(attr: &str, item: &str) -> String {
        let attr: TokenStream = syn::parse_str(attr).unwrap();
        let item: TokenStream = syn::parse_str(item).unwrap();
        tokens(&instrument(attr, item).to_string())
    }

    /// The error of `#[instrument(attr)] item`, and the expansion (the item, unchanged).
    fn error(attr: &str, item: &str) -> (String, String) {
        let attr: TokenStream = syn::parse_str(attr).unwrap();
        let item: TokenStream = syn::parse_str(item).unwrap();
        let err = try_instrument(attr.clone(), item.clone()).err().unwrap();
        (err.to_string(), tokens(&instrument(attr, item).to_string()))
    }

    /// `s` as tokens, printed without whitespace (token printing puts spaces in places that
    /// depend on how the tokens were made); compare with [`expand`]'s output through it too.
    fn tokens(s: &str) -> String {
        let printed = syn::parse_str::<TokenStream>(s).unwrap().to_string();
        printed.chars().filter(|c| !c.is_whitespace()).collect()
    }

    #[test]
    fn plain() {
        assert_eq!(
            expand("", "fn work(n: u32) -> u32 { n + 1 }"),
            tokens(
                "fn work(n: u32) -> u32 { let __tachyon_zone = ::tachyon::zone!(\"work\"); n + 1 }"
            )
        );
    }

    #[test]
    fn every_option() {
        assert_eq!(
            expand(
                r#"name = "custom", category = "io", args(path, r#type, len = path.len(), "a.b" = 1)"#,
                "pub(crate) fn read(path: &str, r#type: u8) {}",
            ),
            tokens(
                r#"pub(crate) fn read(path: &str, r#type: u8) {
                    let __tachyon_zone = ::tachyon::zone!(
                        "io", "custom", "path" = path, "type" = r#type, "len" = path.len(), "a.b" = 1
                    );
                }"#
            )
        );
    }

    #[test]
    fn raw_identifier_name_and_crate_path() {
        assert_eq!(
            expand("crate = my::tachyon", "fn r#match() {}"),
            tokens("fn r#match() { let __tachyon_zone = my::tachyon::zone!(\"match\"); }")
        );
    }

    #[test]
    fn keeps_attributes_docs_and_signature() {
        let out = expand(
            "",
            r#"
            /// Docs.
            #[inline]
            #[allow(clippy::needless_lifetimes)]
            pub unsafe extern "C" fn f<'a, T: Clone>(&'a self, t: T) -> impl Iterator<Item = T> + 'a
            where
                T: Send,
            {
                #![allow(unused)]
                std::iter::once(t)
            }
            "#,
        );
        assert_eq!(
            out,
            tokens(
                r#"
                #[doc = " Docs."]
                #[inline]
                #[allow(clippy::needless_lifetimes)]
                pub unsafe extern "C" fn f<'a, T: Clone>(&'a self, t: T) -> impl Iterator<Item = T> + 'a
                where
                    T: Send,
                {
                    #![allow(unused)]
                    let __tachyon_zone = ::tachyon::zone!("f");
                    std::iter::once(t)
                }
                "#
            )
        );
    }

    #[test]
    fn parameters_bound_by_patterns() {
        let out = expand(
            "args(a, b, c, d, e)",
            "fn f((a, [b, ..]): (u8, [u8; 2]), Point { x: c, .. }: Point, &mut d: &mut u8, e @ 0..=9: u8) {}",
        );
        assert!(out.contains(&tokens(
            r#"::tachyon::zone!("f", "a" = a, "b" = b, "c" = c, "d" = d, "e" = e)"#
        )));
    }

    #[test]
    fn unknown_parameter() {
        let (err, out) = error("args(x, y)", "fn f(x: u8) {}");
        assert_eq!(
            err,
            "`f` has no parameter `y`: record an expression with `y = expr`"
        );
        assert!(out.starts_with("::core::compile_error!"), "{out}");
        assert!(out.ends_with(&tokens("fn f(x: u8) {}")), "{out}");
        // An expression over anything in scope is the caller's business.
        assert!(expand("args(y = 1)", "fn f(x: u8) {}").contains("\"y\"=1"));
        // `self` is not a bare name, but can be used in expressions.
        assert!(expand("args(id = self.id)", "fn f(&self) {}").contains("self.id"));
    }

    #[test]
    fn async_fn_is_rejected() {
        let (err, out) = error("", "async fn fetch() -> u8 { 1 }");
        assert!(err.starts_with("`#[tachyon::instrument]` does not support `async fn`"));
        assert!(err.contains(".await"));
        assert!(
            out.ends_with(&tokens("async fn fetch() -> u8 { 1 }")),
            "{out}"
        );
        let (err, _) = error("", "pub async unsafe fn fetch() {}");
        assert!(err.contains("`async fn`"));
    }

    #[test]
    fn const_fn_is_rejected() {
        let (err, _) = error("", "const fn f() -> u8 { 1 }");
        assert!(err.contains("`const fn`"), "{err}");
    }

    #[test]
    fn not_a_function() {
        let (err, out) = error("", "struct S;");
        assert!(err.contains("applies to functions"), "{err}");
        assert!(out.ends_with(&tokens("struct S;")), "{out}");
        let (err, _) = error("", "fn declared(&self) -> u8;");
        assert!(err.contains("needs a function body"), "{err}");
    }

    #[test]
    fn bad_options_keep_the_item() {
        let (err, out) = error("nmae = \"x\"", "fn f() {}");
        assert!(err.starts_with("unknown option `nmae`"), "{err}");
        assert!(out.ends_with(&tokens("fn f() {}")), "{out}");
    }
}
