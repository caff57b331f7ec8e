//! Every process its own identity: a rank's key holds that rank's seat and no other, cannot serve
//! as the controller, and the controller's key cannot join; old shared keys and unsafe key
//! directories are refused; a flood of half-open handshakes from one address does not keep an
//! honest rank out.

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flodl_cluster::keys::RoleError;
use flodl_cluster::{Hello, JobKeys, Lane, NetError, Role, Tls, TlsError, TlsFiles, join};
use tokio::io::AsyncWriteExt;

use crate::support::{
    RUN, TestResult, WAIT, client_config, config, controller, hello_bytes, joined, keys, target,
    tls_connect, until_closed,
};

/// The controller's answer on a hand-made lane: its frames, decoded as text where they are.
async fn answer(
    addr: std::net::SocketAddr,
    present: &TlsFiles,
    hello: Hello,
) -> Result<String, Box<dyn Error>> {
    let mut tls = match tls_connect(addr, client_config(present, Some(present))?).await {
        Ok(tls) => tls,
        Err(e) => return Ok(format!("TLS refused: {e}")),
    };
    let _ = tls.write_all(&hello_bytes(hello, Lane::Control, 11)).await;
    let _ = tls.flush().await;
    let (bytes, closed) = until_closed(tls, WAIT).await;
    if !closed {
        return Err("the controller left the connection open".into());
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[test]
fn a_rank_key_cannot_claim_another_ranks_seat() -> TestResult {
    let dir = tempfile::tempdir()?;
    let job = keys(dir.path())?;
    let cfg = config(&job)?;
    let server = controller(&cfg, 3)?;
    // join() itself will not say hello for a rank its key is not for.
    match join(&target(server.local_addr()), Hello::new(RUN, 0, 3), cfg.rank(1)?, WAIT) {
        Err(NetError::WrongKey { holds: Role::Rank(1), wants: Role::Rank(0) }) => {}
        other => return Err(format!("join with rank 1's key as rank 0: {other:?}").into()),
    }
    // A hand-made client holding rank 1's key, claiming rank 0 and rank 2: refused by the
    // controller, which reads the rank from the certificate.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    for claimed in [0, 2] {
        let reply = runtime.block_on(answer(
            server.local_addr(),
            &job.rank(1),
            Hello::new(RUN, claimed, 3),
        ))?;
        let want = format!("claims rank {claimed} but its certificate is rank 1's");
        if !reply.contains(&want) {
            return Err(format!("claiming rank {claimed}: {reply:?}, want {want:?}").into());
        }
    }
    // Both seats are still free for their own keys.
    for rank in [0, 2] {
        let (at_controller, at_rank) = joined(&server, &cfg, rank, 3)?;
        at_rank.send(Lane::Control, vec![rank as u8], WAIT)?;
        if at_controller.recv(WAIT)? != [rank as u8] || at_controller.rank() != rank {
            return Err(format!("rank {rank}'s own key could not take its seat").into());
        }
    }
    Ok(())
}

#[test]
fn a_rank_key_cannot_serve_as_the_controller() -> TestResult {
    let dir = tempfile::tempdir()?;
    let job = keys(dir.path())?;
    let cfg = config(&job)?;
    // The library will not serve with it ...
    match flodl_cluster::Controller::bind("127.0.0.1:0".parse()?, RUN, 2, cfg.rank(1)?) {
        Err(NetError::WrongKey { holds: Role::Rank(1), wants: Role::Controller }) => {}
        other => return Err(format!("a controller with rank 1's key: {other:?}").into()),
    }
    // ... and a hand-made server presenting it is refused by a joining rank.
    let files = job.rank(1);
    let server = {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_file_iter(&files.cert)?.collect::<Result<Vec<_>, _>>()?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, PrivateKeyDer::from_pem_file(&files.key)?)?;
        Arc::new(config)
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let acceptor = std::thread::spawn(move || {
        // Serve TLS to whoever comes, until the test ends.
        for tcp in listener.incoming().take(2).flatten() {
            let mut conn =
                rustls::ServerConnection::new(server.clone()).map_err(|e| e.to_string())?;
            let mut tcp = tcp;
            let _ = tcp.set_read_timeout(Some(WAIT));
            while conn.is_handshaking() {
                if conn.complete_io(&mut tcp).is_err() {
                    break;
                }
            }
        }
        Ok::<(), String>(())
    });
    let mut rank0 = cfg.rank(0)?;
    rank0.handshake = Duration::from_secs(3);
    match join(&target(addr), Hello::new(RUN, 0, 2), rank0, Duration::from_secs(3)) {
        Err(NetError::Handshake(reason)) if reason.contains("TLS") => {}
        other => return Err(format!("a rank joining a rank-key server: {other:?}").into()),
    }
    drop(acceptor);
    Ok(())
}

#[test]
fn the_controller_key_cannot_join_as_a_rank() -> TestResult {
    let dir = tempfile::tempdir()?;
    let job = keys(dir.path())?;
    let cfg = config(&job)?;
    let server = controller(&cfg, 2)?;
    match join(&target(server.local_addr()), Hello::new(RUN, 1, 2), (*cfg).clone(), WAIT) {
        Err(NetError::WrongKey { holds: Role::Controller, wants: Role::Rank(1) }) => {}
        other => return Err(format!("join with the controller's key: {other:?}").into()),
    }
    // Presented by hand, the server-only certificate fails the controller's client verification:
    // no welcome, no refusal line (nothing authenticated to answer).
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let reply =
        runtime.block_on(answer(server.local_addr(), &job.controller(), Hello::new(RUN, 1, 2)))?;
    if !(reply.is_empty() || reply.starts_with("TLS refused")) {
        return Err(format!("the controller's key as a rank got {reply:?}").into());
    }
    let (at_controller, _at_rank) = joined(&server, &cfg, 1, 2)?;
    if at_controller.rank() != 1 {
        return Err("rank 1's seat was not free for its own key".into());
    }
    Ok(())
}

/// Each rank's process holds a standby certificate of its own (it serves, a rank's key can
/// join it, its key is neither the controller's nor another standby's), and a rank joins a
/// server only under the name it expects: a standby's key cannot pose as the first controller
/// nor as another rank's standby, and the controller's cannot pose as a standby.
#[test]
fn each_standby_holds_a_controller_identity_of_its_own() -> TestResult {
    let dir = tempfile::tempdir()?;
    let job = keys(dir.path())?;
    let key = |files: &flodl_cluster::TlsFiles| std::fs::read(&files.key);
    for rank in 0..3 {
        if Tls::load(&job.standby(rank))?.role() != Role::Standby(rank) {
            return Err(format!("standby {rank}'s certificate is not rank {rank}'s standby").into());
        }
        if key(&job.standby(rank))? == key(&job.controller())? {
            return Err(format!("standby {rank} shares the controller's key").into());
        }
        if rank > 0 && key(&job.standby(rank))? == key(&job.standby(rank - 1))? {
            return Err(format!("standbys {rank} and {} share a key", rank - 1).into());
        }
    }
    // (server's key, the controller the rank expects, joins)
    let cases = [
        (job.standby(1), Role::Standby(1), true),
        (job.standby(2), Role::Standby(2), true),
        (job.controller(), Role::Controller, true),
        (job.standby(1), Role::Controller, false),
        (job.standby(2), Role::Standby(1), false),
        (job.controller(), Role::Standby(1), false),
    ];
    for (files, serving, joins) in cases {
        let mut cfg = config(&job)?;
        cfg.tls = Tls::load(&files)?;
        cfg.serving = serving;
        let server = controller(&cfg, 3)?;
        let mut rank = cfg.rank(0)?;
        rank.handshake = Duration::from_secs(3);
        let addr = target(server.local_addr());
        let joiner = std::thread::spawn(move || {
            join(&addr, Hello::new(RUN, 0, 3), rank, Duration::from_secs(3))
        });
        let accepted = server.accept(Duration::from_secs(4));
        let outcome = joiner.join().map_err(|_| "the joining thread panicked")?;
        let case = format!("{} serving, the rank expecting {serving}", files.cert.display());
        match (joins, outcome, accepted) {
            (true, Ok(_), Ok(at_server)) if at_server.rank() == 0 => {}
            (false, Err(NetError::Handshake(reason)), Err(_)) if reason.contains("TLS") => {}
            (_, outcome, accepted) => {
                return Err(format!("{case}: joined {outcome:?}, accepted {accepted:?}").into());
            }
        }
    }
    Ok(())
}

#[test]
fn an_old_shared_certificate_is_refused_with_how_to_make_new_keys() -> TestResult {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let dir = tempfile::tempdir()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let mut leaf = CertificateParams::new(vec![flodl_cluster::keys::JOB_SERVER_NAME.to_owned()])?;
    leaf.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let leaf_key = KeyPair::generate()?;
    let leaf_cert = leaf.signed_by(&leaf_key, &Issuer::new(ca, ca_key))?;
    let files = TlsFiles {
        ca: dir.path().join("ca.pem"),
        cert: dir.path().join("cert.pem"),
        key: dir.path().join("key.pem"),
    };
    std::fs::write(&files.ca, ca_cert.pem())?;
    std::fs::write(&files.cert, leaf_cert.pem())?;
    std::fs::write(&files.key, leaf_key.serialize_pem())?;
    match Tls::load(&files) {
        Err(e @ TlsError::Role { source: RoleError::Shared, .. }) => {
            let line = e.to_string();
            if !line.contains("fdl cluster keys DIR --world N") || line.contains('\n') {
                return Err(format!("the refusal does not say how to make new keys: {line}").into());
            }
            Ok(())
        }
        other => Err(format!("an old shared certificate loaded: {other:?}").into()),
    }
}

#[test]
fn a_rank_issued_later_joins_with_its_own_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let keydir = dir.path().join("keys");
    let job = JobKeys::generate(&keydir, 2, &[], true)?;
    let issued = JobKeys::issue(&keydir, 2)?;
    if Tls::load(&issued)?.role() != Role::Rank(2) {
        return Err("the issued certificate is not rank 2's".into());
    }
    let cfg = config(&job)?;
    let server = controller(&cfg, 3)?;
    let (at_controller, _at_rank) = joined(&server, &cfg, 2, 3)?;
    if at_controller.rank() != 2 {
        return Err("the later rank did not take its seat".into());
    }
    // A directory made without the CA's key cannot issue.
    let sealed = tempfile::tempdir()?;
    JobKeys::generate(&sealed.path().join("keys"), 1, &[], false)?;
    match JobKeys::issue(&sealed.path().join("keys"), 1) {
        Err(flodl_cluster::KeyError::NoCaKey { .. }) => Ok(()),
        other => Err(format!("issuing without a CA key: {other:?}").into()),
    }
}

#[cfg(unix)]
#[test]
fn keys_are_not_written_through_links_or_into_an_open_directory() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    // A directory others can read is refused, and left as it was.
    let open = dir.path().join("open");
    std::fs::create_dir(&open)?;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755))?;
    match JobKeys::generate(&open, 1, &[], false) {
        Err(flodl_cluster::KeyError::Unsafe { .. }) => {}
        other => return Err(format!("keys in a 0755 directory: {other:?}").into()),
    }
    if std::fs::read_dir(&open)?.next().is_some() {
        return Err("something was written in the refused directory".into());
    }
    // A directory that is a link is refused.
    let linked = dir.path().join("linked");
    std::os::unix::fs::symlink(&open, &linked)?;
    match JobKeys::generate(&linked, 1, &[], false) {
        Err(flodl_cluster::KeyError::Unsafe { .. }) => {}
        other => return Err(format!("keys in a linked directory: {other:?}").into()),
    }
    // A key file planted as a link is replaced, its target untouched.
    let private = dir.path().join("private");
    std::fs::create_dir(&private)?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious")?;
    std::os::unix::fs::symlink(&victim, private.join("rank-0.key"))?;
    let job = JobKeys::generate(&private, 1, &[], false)?;
    if std::fs::read(&victim)? != b"precious" {
        return Err("the key was written through the link".into());
    }
    if std::fs::symlink_metadata(job.rank(0).key)?.file_type().is_symlink() {
        return Err("the planted link is still there".into());
    }
    Ok(())
}

#[test]
fn a_half_open_flood_from_one_address_does_not_keep_an_honest_rank_out() -> TestResult {
    /// More than the controller's global handshake slots (256): without a per-address limit
    /// the flood holds every slot until its handshake deadline.
    const FLOOD: usize = 320;
    let dir = tempfile::tempdir()?;
    let job = keys(dir.path())?;
    let mut cfg = config(&job)?;
    cfg.handshake = Duration::from_secs(6);
    let server = controller(&cfg, 2)?;
    let addr = server.local_addr();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    // Connections from another loopback address that never start TLS.
    let start = Instant::now();
    let flood = runtime.block_on(async {
        let mut held = Vec::with_capacity(FLOOD);
        for _ in 0..FLOOD {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().map_err(std::io::Error::other)?)?;
            held.push(socket.connect(addr).await?);
        }
        Ok::<_, std::io::Error>(held)
    })?;
    // Give the controller time to accept them all (those above the address's limit are closed).
    std::thread::sleep(Duration::from_millis(300));
    let mut rank = cfg.rank(0)?;
    rank.handshake = Duration::from_secs(2);
    let joiner = {
        let addr = target(addr);
        std::thread::spawn(move || join(&addr, Hello::new(RUN, 0, 2), rank, Duration::from_secs(2)))
    };
    let session = server.accept(Duration::from_secs(3))?;
    joiner.join().map_err(|_| "the joiner panicked")??;
    let took = start.elapsed();
    if session.rank() != 0 || took >= cfg.handshake {
        return Err(format!("the honest rank joined only after {took:?}").into());
    }
    drop(flood);
    Ok(())
}
