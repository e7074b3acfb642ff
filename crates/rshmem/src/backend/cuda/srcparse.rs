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
