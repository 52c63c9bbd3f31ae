//! Queue pairs: the raw-packet send QP and the RSS receive QP (`ibv_create_qp_ex`), the
//! vPort they hold, and their destruction.

use super::*;

/// `mana_create_qp` → `mana_create_qp_raw` (v44 qp.c:29–140), `ibv_cmd_create_qp`
/// (cmd_qp.c:373–399) and `mana_ib_create_qp_raw` in the kernel, behind the exported
/// `ibv_create_qp`.
pub fn create_qp(
    st: &mut State,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, c_int> {
    const CALL: &str = "ibv_create_qp";
    let p = obj(
        st,
        non_null(pd, CALL, "pd").cast::<Pd>(),
        &[Kind::Pd, Kind::ParentDomain],
        CALL,
    );
    let context = p.pd.context;
    let ctx = ctx_of(st, context, CALL);
    // SAFETY: the caller passes its init attr.
    let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr") };
    let v44 = st.cfg.profile == Profile::V44;
    if a.qp_type != IBV_QPT_RAW_PACKET {
        // v44 qp.c:130–137 (main: EOPNOTSUPP, qp.c:353).
        return Err(if v44 { libc::EINVAL } else { libc::EOPNOTSUPP });
    }
    if p.of.is_null() {
        return Err(libc::EINVAL); // not a parent domain, v44 qp.c:47–52
    }
    let port = p.pd_context as usize as u32; // v44 qp.c:55
    if v44 && a.cap.max_send_wr > MAX_WR {
        return Err(libc::EINVAL); // v44 qp.c:59
    }
    if v44 && wqe_size(a.cap.max_send_sge) > u64::from(MAX_TX_WQE) {
        return Err(libc::EINVAL); // v44 qp.c:67
    }
    if !allocators_set(ctx) {
        return Err(libc::EINVAL); // v44 qp.c:75
    }
    let size = hw_size(u64::from(a.cap.max_send_wr) * wqe_size(a.cap.max_send_sge)); // l. 86–88
    let buf = user_alloc(ctx, size)?;
    let fail = |e: c_int| {
        user_free(ctx, buf);
        Err(e)
    };
    // ibv_icmd_create_qp dereferences send_cq and recv_cq (cmd_qp.c:135–143).
    let scq = obj(
        st,
        non_null(a.send_cq, CALL, "send_cq").cast::<Cq>(),
        &[Kind::Cq],
        CALL,
    );
    let rcq = obj(
        st,
        non_null(a.recv_cq, CALL, "recv_cq").cast::<Cq>(),
        &[Kind::Cq],
        CALL,
    );
    if let Err(e) = st.kernel(context, CALL) {
        return fail(e);
    }
    // Kernel, in order: CAP_NET_RAW (uverbs create_qp) → EPERM; max_send_wr > max_qp_wr,
    // max_send_sge > 30, bad port → EINVAL; vPort configuration → ENODEV; pinning.
    if !has_cap_net_raw() {
        return fail(libc::EPERM);
    }
    if a.cap.max_send_wr > KERNEL_MAX_QP_WR || a.cap.max_send_sge > KERNEL_MAX_SEND_SGE {
        return fail(libc::EINVAL);
    }
    if port == 0 || port > u32::from(ctx.nports()) {
        return fail(libc::EINVAL);
    }
    if scq.installed {
        return fail(libc::EINVAL); // mana_ib_install_cq_cb: one queue per CQ
    }
    let dev = ctx.device();
    let real = real_pd(p);
    let key = (dev.index, port);
    let (sqid, cqid);
    {
        let mut vports = VPORTS.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = None;
        let mut new_here = false;
        match vports.get(&key) {
            Some(v) if v.pd != real as *mut Pd as usize => return fail(libc::ENODEV),
            Some(_) => {}
            None => {
                // mana_cfg_vport refuses (EBUSY) while the Ethernet driver uses the vPort;
                // released kernels' mana_ib_create_qp_raw turn any error into ENODEV, newer
                // ones pass EBUSY through (FAKE_RDMA_BUSY_ERRNO).
                let netdev = &dev.view.ports[port as usize - 1].netdev;
                if let Some((name, flags)) = netdev {
                    if world::netdev_up(flags) {
                        let e = st.cfg.busy_errno;
                        eprintln!(
                            "fake-rdma: {CALL}: {} port {port} is held by its netdev {name} (up): {}",
                            device_name(dev),
                            if e == libc::EBUSY { "EBUSY" } else { "ENODEV" }
                        );
                        return fail(e);
                    }
                }
                match take_vport(st, &device_name(dev), port) {
                    Ok(f) => held = f,
                    Err(e) => return fail(e),
                }
                new_here = true;
            }
        }
        if let Err(e) = kernel_pin(buf, size as usize) {
            return fail(e);
        }
        sqid = st.next_id();
        cqid = st.next_id();
        // mana_ib_create_qp_raw creates the SQ and its CQ on the NIC: the device model
        // serves them from now on.
        let vp_offset = dev.view.ports[port as usize - 1].vp_offset;
        // SAFETY: `buf` is this QP's send buffer, given back to the allocator only by
        // ibv_destroy_qp after `remove_tx`; the send CQ cannot be destroyed before the QP.
        let added = unsafe {
            st.nics.add_tx(
                dev,
                port,
                context as usize,
                ctx.db_page,
                Ring {
                    buf,
                    len: size as usize,
                    id: sqid,
                },
                u16::try_from(vp_offset).unwrap_or(u16::MAX),
                CqRing {
                    ring: Ring {
                        buf: scq.buf,
                        len: scq.buf_size,
                        id: cqid,
                    },
                    count: scq.cqe,
                },
                CALL,
            )
        };
        if let Err(e) = added {
            return fail(e);
        }
        if new_here {
            vports.insert(
                key,
                VportUse {
                    pd: real as *mut Pd as usize,
                    qps: 1,
                    _held: held,
                },
            );
        } else if let Some(v) = vports.get_mut(&key) {
            v.qps += 1;
        }
    }
    scq.cqid = cqid; // v44 qp.c:118: send_cq->cqid = resp.cqid
    scq.installed = true;
    scq.users += 1;
    rcq.users += 1;
    real.users += 1;
    let handle = st.next_id();
    let q = Box::into_raw(Box::new(Qp {
        qp: new_qp(context, pd, a.send_cq, a.recv_cq, a.qp_context, handle),
        rss: None,
        send_buf: buf,
        send_buf_size: size as u32,
        send_wqe_count: a.cap.max_send_wr, // after the cap write-back, v44 qp.c:116
        sqid,
        tx_vp_offset: dev.view.ports[port as usize - 1].vp_offset,
        port,
        pd: real,
        cqs: vec![scq as *mut Cq, rcq as *mut Cq],
        device: dev.index,
    }));
    st.register(q as usize, Kind::Qp, context as usize);
    Ok(q.cast::<ibv_qp>())
}

/// `vctx->create_qp_ex` = `mana_create_qp_ex` (v44 qp.c:175–262), the RSS QP.
///
/// # Safety
/// `attr` is the caller's init attr.
pub unsafe extern "C" fn create_qp_ex(
    context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    const CALL: &str = "ibv_create_qp_ex";
    call_ptr(CALL, json!({"context": addr(context)}), |st| {
        let ctx = ctx_of(st, context, CALL);
        // SAFETY: the caller passes its init attr.
        let a = unsafe { &mut *non_null(attr, CALL, "qp_init_attr_ex") };
        let v44 = st.cfg.profile == Profile::V44;
        if a.qp_type != IBV_QPT_RAW_PACKET {
            return Err(if v44 { libc::EINVAL } else { libc::EOPNOTSUPP }); // l. 252–259
        }
        // l. 192: dereferences attr->pd whatever the comp_mask.
        let p = obj(
            st,
            non_null(a.pd, CALL, "qp_init_attr_ex.pd").cast::<Pd>(),
            &[Kind::Pd, Kind::ParentDomain],
            CALL,
        );
        if p.of.is_null() {
            return Err(libc::EINVAL);
        }
        if a.rx_hash_conf.rx_hash_key_len != TOEPLITZ_KEY_LEN {
            return Err(libc::EINVAL); // l. 199–205
        }
        let port = p.pd_context as usize as u32;
        // ibv_cmd_create_qp_ex2: unknown comp_mask bits → EINVAL (cmd_qp.c:434–444);
        // ibv_icmd_create_qp: PD bit required (l. 109–112); with IND_TABLE, recv caps,
        // recv_cq and srq must be empty (l. 117–122).
        let known = IBV_QP_INIT_ATTR_PD
            | IBV_QP_INIT_ATTR_XRCD
            | IBV_QP_INIT_ATTR_CREATE_FLAGS
            | IBV_QP_INIT_ATTR_MAX_TSO_HEADER
            | IBV_QP_INIT_ATTR_IND_TABLE
            | IBV_QP_INIT_ATTR_RX_HASH
            | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 || a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_IND_TABLE == 0 {
            // Without a table this is a send QP through the extended call; MANA's RSS path
            // needs the table (the kernel finds no WQs).
            return Err(libc::EINVAL);
        }
        if a.cap.max_recv_wr != 0
            || a.cap.max_recv_sge != 0
            || !a.recv_cq.is_null()
            || !a.srq.is_null()
        {
            return Err(libc::EINVAL);
        }
        let t = obj(
            st,
            non_null(a.rwq_ind_tbl, CALL, "rwq_ind_tbl").cast::<Ind>(),
            &[Kind::IndTable],
            CALL,
        );
        st.kernel(context, CALL)?;
        // Kernel mana_ib_create_qp_rss: CAP_NET_RAW, Toeplitz only, table ≤ 64, port range,
        // one WQ per CQ.
        if !has_cap_net_raw() {
            return Err(libc::EPERM);
        }
        if u32::from(a.rx_hash_conf.rx_hash_function) != IBV_RX_HASH_FUNC_TOEPLITZ {
            return Err(libc::EINVAL);
        }
        if t.wqs.len() > KERNEL_MAX_IND_TABLE as usize {
            return Err(libc::EINVAL);
        }
        if port == 0 || port > u32::from(ctx.nports()) {
            return Err(libc::EINVAL);
        }
        let mut cqs: Vec<*mut Cq> = Vec::new();
        for &w in &t.wqs {
            // SAFETY: the table's WQs are live (they cannot be destroyed while it exists).
            let cq = unsafe { (*w).cq };
            // SAFETY: a WQ's CQ is live while the WQ is.
            if unsafe { (*cq).installed } || cqs.contains(&cq) {
                return Err(libc::EINVAL); // mana_ib_install_cq_cb
            }
            cqs.push(cq);
        }
        // Response entries: wq->wqid and wq->cq->cqid (v44 qp.c:236–243).
        let ids: Vec<(u32, u32)> = t.wqs.iter().map(|_| (st.next_id(), st.next_id())).collect();
        // mana_ib_create_qp_rss creates each WQ's RQ and CQ on the NIC and configures the
        // vPort's steering: the device model serves them from now on.
        // SAFETY: the table's WQs and their CQs are live and cannot be destroyed while this
        // QP exists; ibv_destroy_qp calls `remove_rss` first.
        let rqs: Vec<(Ring, CqRing)> = t
            .wqs
            .iter()
            .zip(&ids)
            .map(|(&w, &(wqid, cqid))| unsafe {
                let cq = &*(*w).cq;
                (
                    Ring {
                        buf: (*w).buf,
                        len: (*w).buf_size,
                        id: wqid,
                    },
                    CqRing {
                        ring: Ring {
                            buf: cq.buf,
                            len: cq.buf_size,
                            id: cqid,
                        },
                        count: cq.cqe,
                    },
                )
            })
            .collect();
        let key_ptr = non_null(a.rx_hash_conf.rx_hash_key, CALL, "rx_hash_key");
        let mut rss_key = [0u8; TOEPLITZ_KEY_LEN as usize];
        // SAFETY: the caller's key has rx_hash_key_len = 40 bytes (checked above).
        unsafe { std::ptr::copy_nonoverlapping(key_ptr, rss_key.as_mut_ptr(), rss_key.len()) };
        // SAFETY: as above: the buffers outlive the QP, whose destruction removes them.
        unsafe {
            st.nics.add_rss(
                ctx.device(),
                port,
                context as usize,
                ctx.db_page,
                &rqs,
                rss_key,
                CALL,
            )
        }?;
        for (&w, &(wqid, cqid)) in t.wqs.iter().zip(&ids) {
            // SAFETY: as above.
            unsafe {
                (*w).wqid = wqid;
                (*(*w).cq).cqid = cqid;
                (*(*w).cq).installed = true;
            }
        }
        t.users += 1;
        let real = real_pd(p);
        real.users += 1;
        let handle = st.next_id();
        let dev = ctx.device().index;
        let q = Box::into_raw(Box::new(Qp {
            qp: new_qp(context, a.pd, a.send_cq, a.recv_cq, a.qp_context, handle),
            rss: Some(t),
            send_buf: null_mut(),
            send_buf_size: 0,
            send_wqe_count: 0,
            sqid: 0,
            tx_vp_offset: 0,
            port,
            pd: real,
            cqs,
            device: dev,
        }));
        st.register(q as usize, Kind::Qp, context as usize);
        Ok(q.cast::<ibv_qp>())
    })
}

/// `mana_modify_qp`: always EOPNOTSUPP, as the return value (v44 qp.c:142–145); libibverbs
/// stores qp->state only on success (verbs.c:708–723).
pub fn modify_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let _ = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_modify_qp");
    Err(libc::EOPNOTSUPP)
}

/// MANA v44 has no query_qp op: the libibverbs dummy answers EOPNOTSUPP.
pub fn query_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let _ = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_query_qp");
    Err(libc::EOPNOTSUPP)
}

/// Releases what a QP holds in the kernel (its queues on the NIC, CQ slots, table, PD,
/// vPort). The NIC lets go of the queues first, so their memory may be freed afterwards.
pub(super) fn release_qp(st: &mut State, q: &mut Qp) {
    match q.rss {
        None => st.nics.remove_tx(q.device, q.port, q.sqid),
        Some(t) => {
            // SAFETY: the table and its WQs cannot be destroyed while the QP uses them.
            let ids: Vec<u32> = unsafe { (*t).wqs.iter().map(|&w| (*w).wqid).collect() };
            st.nics.remove_rss(q.device, q.port, &ids);
        }
    }
    // A send QP counts as a user of its send and receive CQs and installed only the send
    // CQ (the first); an RSS QP installed every CQ of its table's WQs, whose users they are.
    for (i, &c) in q.cqs.iter().enumerate() {
        // SAFETY: CQs cannot be destroyed while the QP or its table's WQs use them.
        unsafe {
            if q.rss.is_none() {
                (*c).users -= 1;
            }
            if q.rss.is_some() || i == 0 {
                (*c).installed = false;
            }
        }
    }
    if let Some(t) = q.rss {
        // SAFETY: the table cannot be destroyed while the QP uses it.
        unsafe { (*t).users -= 1 };
    }
    // SAFETY: the PD cannot be deallocated while the QP uses it.
    unsafe { (*q.pd).users -= 1 };
    if q.rss.is_none() {
        let mut vports = VPORTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = vports.get_mut(&(q.device, q.port)) {
            v.qps -= 1;
            if v.qps == 0 {
                // mana_ib_uncfg_vport; the file's lock goes with it.
                vports.remove(&(q.device, q.port));
            }
        }
    }
}

/// `mana_destroy_qp` (v44 qp.c:147–173) behind the exported `ibv_destroy_qp`.
pub fn destroy_qp(st: &mut State, qp: *mut ibv_qp) -> Result<c_int, c_int> {
    let q = obj(st, qp.cast::<Qp>(), &[Kind::Qp], "ibv_destroy_qp");
    let ctx = ctx_of(st, q.qp.context, "ibv_destroy_qp");
    // v44 qp.c:153–161: free unset → -EINVAL before the kernel (main: no check).
    if st.cfg.profile == Profile::V44 && ctx.alloc.free.is_none() {
        return Ok(-libc::EINVAL);
    }
    // A disassociated context: the kernel released the QP already (`disassociate`).
    if !st.disassociated(q.qp.context) {
        st.kernel(q.qp.context, "ibv_destroy_qp")?;
        release_qp(st, q);
    }
    // v44 qp.c:169 (main qp.c:457–460, RAW_PACKET): the send buffer goes back, for every
    // raw QP: an RSS QP's is NULL (its `struct mana_qp` is calloc'd, qp.c:210, and
    // send_buf never set), so the user's free gets NULL. A free reset to NULL is called
    // all the same in main (no check there): a crash.
    let Some(free) = ctx.alloc.free else {
        die(
            "ibv_destroy_qp",
            "the context's free callback was reset to NULL: real libmana (main) calls it for the QP's send buffer (qp.c:459) and crashes",
        );
    };
    // SAFETY: the user's callback, with a buffer from its allocator (or NULL for an RSS
    // QP, as libmana passes it) and its current `data`.
    unsafe { free(q.send_buf, ctx.alloc.data) };
    st.unregister(qp as usize);
    // SAFETY: unregistered above; freed once.
    drop(unsafe { Box::from_raw(q as *mut Qp) });
    Ok(0)
}
