use super::*;
use crate::config::parse_devices;
use std::time::Duration;

/// Every region in its place, no overlap, the documented size, the stream slot after
/// every host team slot.
#[test]
fn sync_layout_regions() {
    for (n, teams) in [
        (1, 1),
        (2, 64),
        (8, 64),
        (64, 64),
        (72, 64),
        (72, 8),
        (1000, 4096),
    ] {
        let l = SyncLayout::new(n, teams).unwrap();
        assert_eq!(l.slots, teams + 1);
        assert_eq!(l.stream_slot(), teams, "after host slots 0..{teams}");
        assert_eq!(l.bar(), 0);
        assert_eq!(l.exp(), (teams + 1) * n);
        assert_eq!(l.err(), 2 * (teams + 1) * n);
        assert_eq!(l.bases(), l.err() + 8);
        assert_eq!(l.words(), l.bases() + n);
        assert_eq!(
            l.bytes(),
            n * (teams + 1) * 16 + 64 + 8 * n,
            "{n} PEs, {teams}"
        );
        // First and last word of each slot's rows stay in their region.
        for slot in [0, teams - 1, l.stream_slot()] {
            assert!(l.bar_word(slot, 0) >= l.bar() && l.bar_word(slot, n - 1) < l.exp());
            assert!(l.exp_word(slot, 0) >= l.exp() && l.exp_word(slot, n - 1) < l.err());
        }
        assert_eq!(l.bar_word(l.stream_slot(), n - 1), l.exp() - 1);
        assert_eq!(l.exp_word(l.stream_slot(), n - 1), l.err() - 1);
        // Distinct (slot, pe) pairs get distinct words.
        assert_eq!(l.bar_word(1, 0), l.bar_word(0, n - 1) + 1);
    }
    // 72 PEs with the default 64 teams: 75,520 bytes per PE.
    assert_eq!(SyncLayout::new(72, 64).unwrap().bytes(), 75_520);
}

#[test]
fn sync_layout_rejects_what_it_cannot_hold() {
    for (n, teams) in [
        (0, 64),
        (2, 0),
        (usize::MAX / 4, 64),
        (2, usize::MAX),
        (i32::MAX as usize + 1, 1),
        (i32::MAX as usize, i32::MAX as usize - 1),
    ] {
        assert!(
            matches!(SyncLayout::new(n, teams), Err(Error::InvalidArgument(_))),
            "{n} PEs, {teams} teams"
        );
    }
}

#[test]
fn device_state_points_into_the_sync_area() {
    let l = SyncLayout::new(72, 64).unwrap();
    let heap = 2 << 20;
    let bases: Vec<u64> = (0..72u64)
        .map(|p| 0x7f00_0000_0000 + p * 0x100_0000)
        .collect();
    let st = DeviceState::new(&l, &bases, 5, heap, Duration::from_millis(1500));
    let sync = bases[5] + heap as u64;
    assert_eq!(st.my_base, bases[5]);
    assert_eq!(st.base, sync + 8 * l.bases() as u64);
    // The base table ends exactly where the allocation's sync area does.
    assert_eq!(st.base + 8 * 72, sync + l.bytes() as u64);
    assert_eq!(st.heap_size, heap as u64);
    assert_eq!(st.timeout_ns, 1_500_000_000);
    assert_eq!(
        (st.sync_bar, st.sync_exp, st.sync_err),
        (0, l.exp() as u64, l.err() as u64)
    );
    assert_eq!(
        (st.my_pe, st.n_pes, st.team_slots, st.stream_slot),
        (5, 72, 65, 64)
    );
}

/// `rshmem_state` of the header has the fields of `DeviceState`, in order, at the same
/// offsets, and no compiled-in limit is left.
#[test]
fn header_state_matches_device_state() {
    let h = nvrtc::DEVICE_HEADER;
    let body = h
        .split("struct rshmem_state {")
        .nth(1)
        .and_then(|b| b.split("};").next())
        .expect("struct rshmem_state in the header");
    let mut off = 0usize;
    let mut fields = Vec::new();
    for line in body.lines() {
        let decl = line.split("//").next().unwrap_or("").trim();
        let Some(decl) = decl.strip_suffix(';') else {
            continue;
        };
        let (ty, name) = decl.rsplit_once(' ').expect("type and name");
        let size = match ty.trim() {
            "const rshmem_u64*" | "rshmem_u64" => 8,
            "int" => 4,
            other => panic!("unexpected field type {other:?}"),
        };
        assert_eq!(off % size, 0, "{name} is unaligned");
        fields.push((name.trim_start_matches('*').to_string(), off));
        off += size;
    }
    let rust = [
        ("base", std::mem::offset_of!(DeviceState, base)),
        ("my_base", std::mem::offset_of!(DeviceState, my_base)),
        ("heap_size", std::mem::offset_of!(DeviceState, heap_size)),
        ("timeout_ns", std::mem::offset_of!(DeviceState, timeout_ns)),
        ("sync_bar", std::mem::offset_of!(DeviceState, sync_bar)),
        ("sync_exp", std::mem::offset_of!(DeviceState, sync_exp)),
        ("sync_err", std::mem::offset_of!(DeviceState, sync_err)),
        ("my_pe", std::mem::offset_of!(DeviceState, my_pe)),
        ("n_pes", std::mem::offset_of!(DeviceState, n_pes)),
        ("team_slots", std::mem::offset_of!(DeviceState, team_slots)),
        (
            "stream_slot",
            std::mem::offset_of!(DeviceState, stream_slot),
        ),
    ];
    let rust: Vec<(String, usize)> = rust.iter().map(|(n, o)| (n.to_string(), *o)).collect();
    assert_eq!(fields, rust);
    assert_eq!(off, std::mem::size_of::<DeviceState>());
    assert!(h.contains(&format!("static_assert(sizeof(rshmem_state) == {off}")));
    assert!(h.contains(&format!("#define RSHMEM_ERR_BAD_TEAM {ERR_BAD_TEAM}ull")));
    assert!(h.contains(&format!("#define RSHMEM_ERR_REMOTE_OP {ERR_REMOTE_OP}ull")));
    for gone in ["RSHMEM_MAX_PES", "RSHMEM_MAX_TEAMS", "RSHMEM_SYNC_"] {
        assert!(!h.contains(gone), "{gone} is back in the header");
    }
}

/// The internal kernels this file launches take the parameters their launch sites pass
/// (the driver reads as many bytes per parameter as the kernel declares).
#[test]
fn internal_launches_match_the_kernel_signatures() {
    let src = nvrtc::INTERNAL_KERNELS;
    let params = |name: &str| {
        let head = format!("void {name}(");
        let at = src.find(&head).expect("kernel") + head.len();
        let len = src[at..].find(')').expect("parameter list");
        srcparse::param_types(&src[at..at + len])
    };
    // `atomic`: addr, wide, op, a, b, out (the scratch buffer).
    assert_eq!(
        params("rshmemi_host_amo"),
        [
            "rshmem_u64",
            "int",
            "int",
            "rshmem_u64",
            "rshmem_u64",
            "ptr"
        ]
    );
    // `take_device_error`: out (the scratch buffer: 64 bytes, the kernel writes 16).
    assert_eq!(params("rshmemi_take_error"), ["ptr"]);
    assert!(src.contains("out[0] = atomicExch(w, 0ull);\n    out[1] = atomicExch(w + 1, 0ull);"));
}

#[test]
fn device_errors_name_the_pe_waited_for() {
    const ERR_TIMEOUT: u64 = 1; // RSHMEM_ERR_TIMEOUT
    let t = Duration::from_secs(3);
    let pe_of = |e: Error| match e {
        Error::Timeout { pe, after, .. } => {
            assert_eq!(after, t);
            pe
        }
        other => panic!("expected a timeout, got {other:?}"),
    };
    assert_eq!(pe_of(device_error(ERR_TIMEOUT, 0, 4, t)), None);
    assert_eq!(pe_of(device_error(ERR_TIMEOUT, 1, 4, t)), Some(0));
    assert_eq!(pe_of(device_error(ERR_TIMEOUT, 4, 4, t)), Some(3));
    assert_eq!(pe_of(device_error(ERR_TIMEOUT, 5, 4, t)), None);
    assert!(matches!(
        device_error(ERR_BAD_TEAM | ERR_TIMEOUT, 2, 4, t),
        Error::Team(_)
    ));
    // A device atomic or `g` to a PE of another node names it, before any timeout.
    match device_error(ERR_REMOTE_OP | ERR_TIMEOUT, 3, 4, t) {
        Error::InvalidArgument(m) => assert!(m.contains("PE 2 on another node"), "{m}"),
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

#[test]
fn pes_sharing_a_context_are_same_process_same_gpu() {
    // PEs 0..4 in process 7 (GPUs 0,1,0,1), PEs 4..6 in process 9 (GPU 0).
    let pids = [7, 7, 7, 7, 9, 9];
    let ords = [0, 1, 0, 1, 0, 0];
    assert_eq!(same_context_pes(&pids, &ords, 0), vec![0, 2]);
    assert_eq!(same_context_pes(&pids, &ords, 3), vec![1, 3]);
    assert_eq!(same_context_pes(&pids, &ords, 5), vec![4, 5]);
    assert_eq!(same_context_pes(&[7, 8], &[0, 0], 1), vec![1]);
}

#[test]
fn device_choice_wraps_and_follows_the_map() {
    let two = || Ok(2);
    let got: Vec<usize> = (0..5).map(|me| device_of(None, me, two).unwrap()).collect();
    assert_eq!(got, [0, 1, 0, 1, 0], "fewer GPUs than PEs: round robin");
    for me in 0..4 {
        assert_eq!(device_of(None, me, || Ok(1)).unwrap(), 0, "one GPU: shared");
    }
    assert!(device_of(None, 0, || Ok(0)).is_err(), "no GPU");
    let e = device_of(None, 0, || Err(ffi::err("no driver"))).unwrap_err();
    assert!(matches!(e, Error::Backend { .. }), "{e}");
    // A map wins and is not checked against the count here (gpu::gpu does that).
    let map = parse_devices("0, 0,1,0").unwrap();
    let never = || -> Result<usize> { panic!("the count is not needed with a map") };
    let got: Vec<usize> = (0..4)
        .map(|me| device_of(Some(&map), me, never).unwrap())
        .collect();
    assert_eq!(got, [0, 0, 1, 0]);
    assert!(matches!(
        device_of(Some(&map), 4, never),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(parse_devices("0,x"), None);
}

/// The staging area of a CUDA world spanning nodes is page-locked this way: only whole pages
/// inside the range, copies through it exact, and the registration gone when the value drops
/// (registering the same pages again would otherwise fail).
#[test]
#[ignore = "needs a GPU"]
fn a_page_locked_range_copies_exactly_and_is_released_on_drop() {
    let g = gpu::gpu(0).expect("GPU 0");
    // A shared mapping, as a world's segment is, the range starting and ending mid-page.
    let len = 4 << 20;
    // SAFETY: a fresh anonymous mapping, unmapped at the end.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let base = map as *mut u8;
    // SAFETY: sysconf reads a constant.
    let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
    // SAFETY: the mapping stays until munmap below, after every registration dropped.
    let small = unsafe { gpu::HostPin::register(&g, base.wrapping_add(8), 100) };
    assert!(matches!(small, Ok(None)), "no whole page inside");
    for round in 0..2u8 {
        // SAFETY: as above.
        let pin = unsafe { gpu::HostPin::register(&g, base.wrapping_add(100), len - 300) }
            .unwrap_or_else(|e| panic!("round {round}: register: {e}"))
            .expect("whole pages inside");
        let (p, l) = pin.range();
        assert_eq!((p as usize - base as usize, l), (page, len - 2 * page));
        // SAFETY: inside the mapping.
        let host = unsafe { std::slice::from_raw_parts_mut(p, l) };
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ round as u64;
        for b in host.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = (x >> 24) as u8;
        }
        let want = host.to_vec();
        let dev = gpu::DevBuf::zeroed(&g, l).expect("device buffer");
        let stream = gpu::RawStream::new(&g).expect("stream");
        let _c = g.bind().expect("bind");
        // SAFETY: both ranges hold `l` bytes and outlive the synchronised copies.
        unsafe {
            let r = ffi::cu::cuMemcpyHtoDAsync_v2(dev.ptr, p.cast(), l, stream.raw);
            assert_eq!(r, ffi::cu::CUresult::CUDA_SUCCESS);
            // From page-locked memory the copy is asynchronous (DMA): the bytes may be
            // rewritten only once the stream is synchronised.
            stream.sync().expect("sync");
            host.fill(0x5A);
            let r = ffi::cu::cuMemcpyDtoHAsync_v2(p.cast(), dev.ptr, l, stream.raw);
            assert_eq!(r, ffi::cu::CUresult::CUDA_SUCCESS);
        }
        stream.sync().expect("sync");
        assert!(host[..] == want[..], "round {round}: bytes through the GPU");
        drop(pin);
    }
    // SAFETY: the mapping made above; nothing registered in it any more.
    unsafe { libc::munmap(map, len) };
}
