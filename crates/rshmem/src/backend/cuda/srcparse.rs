//! Test helpers reading kernel sources (`kernels/*.cu`), shared by the modules whose tests
//! check launch sites against the kernels' declarations.

/// Types of a kernel's comma-separated parameter list: pointers as `ptr`, `const` dropped,
/// macro line continuations ignored.
pub(crate) fn param_types(list: &str) -> Vec<String> {
    list.replace('\\', " ")
        .split(',')
        .map(|p| {
            let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
            let ty = p.rsplit_once(' ').map_or(p.as_str(), |(t, _)| t);
            if p.contains('*') {
                "ptr".to_string()
            } else {
                ty.trim_start_matches("const ").to_string()
            }
        })
        .collect()
}

#[test]
fn param_types_of_a_list() {
    assert_eq!(
        param_types("const float* a, int n, \\\n rshmem_team t"),
        ["ptr", "int", "rshmem_team"]
    );
}

/// A macro of [`kernel_names`]: parameters (function-like) and replacement tokens.
struct Macro {
    params: Option<Vec<String>>,
    body: Vec<String>,
}

/// The names of the kernels (`__global__` functions) `src` defines once preprocessed, in order.
/// A preprocessor just large enough for rshmem's kernel sources: line splices, comments,
/// `#define` (object- and function-like, `##` pasting), `#undef`, `#ifdef`, `#ifndef`, `#if`
/// (on an integer after expansion; any other condition counts as true), `#elif`, `#else`,
/// `#endif`; other directives ignored; an expansion is rescanned on its own (not with the text
/// after it).
pub(crate) fn kernel_names(src: &str) -> Vec<String> {
    let text = strip_comments(&src.replace("\\\n", ""));
    let mut defs: std::collections::HashMap<String, Macro> = Default::default();
    // Per open conditional: (this branch is active, some branch was taken).
    let mut conds: Vec<(bool, bool)> = Vec::new();
    let mut pending = String::new();
    let mut names = Vec::new();
    for line in text.lines() {
        let active = conds.iter().all(|c| c.0);
        let Some(d) = line.trim_start().strip_prefix('#') else {
            if active {
                pending.push_str(line);
                pending.push('\n');
            }
            continue;
        };
        if active {
            globals(
                &expand(&tokens(&pending), &defs, &mut Vec::new()),
                &mut names,
            );
            pending.clear();
        }
        let d = d.trim_start();
        let word: String = d.chars().take_while(|c| c.is_alphanumeric()).collect();
        let rest = d[word.len()..].trim();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let eval = |e: &str| {
            let t = expand(&tokens(e), &defs, &mut Vec::new());
            match t.as_slice() {
                [n] if n.starts_with(|c: char| c.is_ascii_digit()) => {
                    n.trim_end_matches(['u', 'U', 'l', 'L']) != "0"
                }
                // An identifier left after expansion is no macro: 0.
                [n] => !n.starts_with(|c: char| c.is_alphabetic() || c == '_'),
                _ => true,
            }
        };
        match word.as_str() {
            "ifdef" => conds.push((defs.contains_key(&name), defs.contains_key(&name))),
            "ifndef" => conds.push((!defs.contains_key(&name), !defs.contains_key(&name))),
            "if" => {
                let c = eval(rest);
                conds.push((c, c));
            }
            "elif" => {
                let c = eval(rest);
                if let Some(top) = conds.last_mut() {
                    *top = (!top.1 && c, top.1 || c);
                }
            }
            "else" => {
                if let Some(top) = conds.last_mut() {
                    *top = (!top.1, true);
                }
            }
            "endif" => {
                conds.pop();
            }
            "define" if active => {
                let after = &rest[name.len()..];
                let m = match after.strip_prefix('(') {
                    Some(p) => {
                        let close = p.find(')').unwrap_or(p.len());
                        let params = p[..close]
                            .split(',')
                            .map(|s| s.trim().to_string())
                            .filter(|s| !s.is_empty())
                            .collect();
                        Macro {
                            params: Some(params),
                            body: tokens(&p[(close + 1).min(p.len())..]),
                        }
                    }
                    None => Macro {
                        params: None,
                        body: tokens(after),
                    },
                };
                defs.insert(name, m);
            }
            "undef" if active => {
                defs.remove(&name);
            }
            _ => {}
        }
    }
    globals(
        &expand(&tokens(&pending), &defs, &mut Vec::new()),
        &mut names,
    );
    names
}

/// `src` with every comment replaced by a space (newlines of block comments kept).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut it = src.chars().peekable();
    while let Some(c) = it.next() {
        match c {
            '/' if it.peek() == Some(&'/') => {
                while it.peek().is_some_and(|&c| c != '\n') {
                    it.next();
                }
                out.push(' ');
            }
            '/' if it.peek() == Some(&'*') => {
                it.next();
                let mut last = ' ';
                for c in it.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                    }
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
                out.push(' ');
            }
            '"' | '\'' => {
                out.push(c);
                while let Some(d) = it.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some(e) = it.next() {
                            out.push(e);
                        }
                    } else if d == c || d == '\n' {
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Preprocessing tokens of `s` (whitespace dropped): identifiers, numbers, string and character
/// literals, `##`, single punctuation characters.
fn tokens(s: &str) -> Vec<String> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        i += 1;
        if c.is_whitespace() {
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_' || b[i] == '.') {
                if b[i] == '.' && !c.is_ascii_digit() {
                    break;
                }
                i += 1;
            }
        } else if c == '"' || c == '\'' {
            while i < b.len() && b[i] != c {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
        } else if c == '#' && b.get(i) == Some(&'#') {
            i += 1;
        }
        out.push(b[start..i].iter().collect());
    }
    out
}

/// `toks` with their macros expanded; `hide`: the macros being expanded (not expanded again).
fn expand(
    toks: &[String],
    defs: &std::collections::HashMap<String, Macro>,
    hide: &mut Vec<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        let m = defs.get(t).filter(|_| !hide.contains(t));
        match m.map(|m| (&m.params, &m.body)) {
            Some((None, body)) => {
                hide.push(t.clone());
                out.extend(expand(body, defs, hide));
                hide.pop();
                i += 1;
            }
            Some((Some(params), body)) if toks.get(i + 1).is_some_and(|p| p == "(") => {
                // The arguments: top-level commas split them, up to the matching parenthesis.
                let mut args: Vec<Vec<String>> = vec![Vec::new()];
                let mut depth = 0;
                let mut j = i + 2;
                while j < toks.len() {
                    match toks[j].as_str() {
                        ")" if depth == 0 => break,
                        "," if depth == 0 => args.push(Vec::new()),
                        x => {
                            depth += (x == "(") as i32 - (x == ")") as i32;
                            args.last_mut()
                                .into_iter()
                                .for_each(|a| a.push(x.to_string()));
                        }
                    }
                    j += 1;
                }
                let mut sub: Vec<String> = Vec::new();
                let mut paste = false;
                for (k, bt) in body.iter().enumerate() {
                    if bt == "##" {
                        paste = true;
                        continue;
                    }
                    let raw = paste || body.get(k + 1).is_some_and(|n| n == "##");
                    let repl = match params.iter().position(|p| p == bt) {
                        Some(p) if raw => args.get(p).cloned().unwrap_or_default(),
                        Some(p) => expand(args.get(p).map_or(&[][..], |a| a), defs, hide),
                        None => vec![bt.clone()],
                    };
                    let mut repl = repl.into_iter();
                    if std::mem::take(&mut paste) {
                        let left = sub.pop().unwrap_or_default();
                        sub.push(left + &repl.next().unwrap_or_default());
                    }
                    sub.extend(repl);
                }
                hide.push(t.clone());
                out.extend(expand(&sub, defs, hide));
                hide.pop();
                i = j + 1;
            }
            _ => {
                out.push(t.clone());
                i += 1;
            }
        }
    }
    out
}

/// Appends the name of every `__global__` function in `toks`: the first identifier after
/// `__global__` that a `(` follows.
fn globals(toks: &[String], names: &mut Vec<String>) {
    for (i, _) in toks.iter().enumerate().filter(|(_, t)| *t == "__global__") {
        let name = toks[i + 1..]
            .windows(2)
            .find(|w| w[1] == "(" && w[0].starts_with(|c: char| c.is_alphabetic() || c == '_'));
        if let Some(w) = name {
            names.push(w[0].clone());
        }
    }
}

#[test]
fn kernel_names_of_a_source_with_macros() {
    let src = r#"
// comment __global__ void not_this(
#define PASTE(A, B) k_##A##_##B
#define TYPES(X) X(int, i) /* X(float, f) */ \
    X(long, l)
#define KERNEL(T, N) extern "C" __global__ void PASTE(N, sum)(T* p) { p[0] = T(1); }
TYPES(KERNEL)
#ifndef SKIP
extern "C" __global__ void plain(int n) {}
#else
extern "C" __global__ void skipped(int n) {}
#endif
#if ZERO
extern "C" __global__ void zero(int n) {}
#endif
#define ONE 1
#if ONE
extern "C" __global__ void one(int n) {}
#endif
#undef KERNEL
#define KERNEL(T, N)
TYPES(KERNEL)
"#;
    assert_eq!(kernel_names(src), ["k_i_sum", "k_l_sum", "plain", "one"]);
    let skip = format!("#define SKIP\n{src}");
    assert_eq!(
        kernel_names(&skip),
        ["k_i_sum", "k_l_sum", "skipped", "one"]
    );
}
