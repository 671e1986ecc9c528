//! `picnic ctl feedback-key`: the key that authenticates congestion feedback between hosts,
//! rotated cluster-wide through etcd (`keys/feedback`) without refusing any host's feedback
//! (docs/switch.md "Rotating the feedback key").
//!
//! A rotation takes two writes, each waited for on every switch that is up. First the new
//! key is staged: every switch accepts it but none signs with it. Only once every switch
//! accepts it is it activated: switches sign with it as they learn that (in any order), and
//! the old key stays accepted as the previous one. Activating at once would have the first
//! switches to learn it sign with a key the others refuse until they learn it too.

use std::io::Read;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use etcd_client::Client;
use picnic_control::cluster::{key, Kind, FEEDBACK_KEY};
use picnic_control::store::{self, Expect};
use picnic_switch::config::{EpochKey, FeedbackKeys};

use super::status;

#[derive(Subcommand)]
pub enum FeedbackKeyCmd {
    /// Generates a 32-byte key and makes it the one every switch signs feedback with, in
    /// two steps (staged, then active), each waited for on every switch that is up (at most
    /// --wait-s); the old key stays accepted until the next rotation. A rotation that
    /// stopped after staging is finished by running it again.
    Rotate,
    /// The epochs held and their fingerprints (never the keys).
    Show,
}

/// Runs `cmd` against the cluster in etcd; `wait` bounds each wait for the switches.
pub async fn run(
    client: &mut Client,
    prefix: &str,
    cmd: &FeedbackKeyCmd,
    wait: Duration,
) -> anyhow::Result<()> {
    let snap = store::load(client, prefix).await?;
    let current = snap.cluster.feedback_key.clone().unwrap_or_default();
    match cmd {
        FeedbackKeyCmd::Show => {
            println!("{}", serde_json::to_string_pretty(&current.redacted())?);
            Ok(())
        }
        FeedbackKeyCmd::Rotate => {
            if wait.is_zero() {
                bail!("--wait-s 0: a rotation waits for every switch between its two steps");
            }
            let at = snap
                .versions
                .get(&key(prefix, Kind::Key, FEEDBACK_KEY))
                .copied();
            rotate(client, prefix, current, at, wait).await
        }
    }
}

async fn rotate(
    client: &mut Client,
    prefix: &str,
    current: FeedbackKeys,
    at: Option<i64>,
    wait: Duration,
) -> anyhow::Result<()> {
    let (staged, revision) = match (&current.next, at) {
        (Some(next), Some(at)) => {
            println!(
                "epoch {} is staged already (a rotation that stopped): activating it",
                next.epoch
            );
            (current.clone(), at)
        }
        _ => {
            let epoch = current.all().map(|k| k.epoch).max().unwrap_or(0) + 1;
            let record = FeedbackKeys {
                next: Some(EpochKey {
                    epoch,
                    key: random_key()?,
                }),
                ..current.clone()
            };
            let expect = at.map_or(Expect::Absent, Expect::At);
            let revision =
                store::put(client, prefix, Kind::Key, FEEDBACK_KEY, &record, expect).await?;
            println!("step 1 of 2: epoch {epoch} staged at revision {revision}");
            (record, revision)
        }
    };
    status::wait_for(client, prefix, revision, wait)
        .await
        .context(
        "the new key is staged, not active: run `picnic ctl feedback-key rotate` again to finish",
    )?;
    let next = staged.next.clone().context("a staged key")?;
    let epoch = next.epoch;
    let record = FeedbackKeys {
        previous: staged.active.clone(),
        active: Some(next),
        next: None,
    };
    let revision = store::put(
        client,
        prefix,
        Kind::Key,
        FEEDBACK_KEY,
        &record,
        Expect::At(revision),
    )
    .await?;
    match &record.previous {
        Some(old) => println!(
            "step 2 of 2: epoch {epoch} active at revision {revision}; epoch {} accepted until the next rotation",
            old.epoch
        ),
        None => println!("step 2 of 2: epoch {epoch} active at revision {revision}"),
    }
    status::wait_for(client, prefix, revision, wait).await
}

/// 32 bytes from the kernel's random source (/dev/urandom), hex.
fn random_key() -> anyhow::Result<String> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("reading /dev/urandom for a new key")?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}
