//! The `Mutex` custom resource (`tekton-mutex.dev/v1alpha1`): one object per key.
//!
//! Its status is the lock's only source of truth. Every change to it is a
//! compare-and-swap on the object's resourceVersion, which is what keeps
//! holders within capacity and tokens unique across restarts and replicas.

use jiff::Timestamp;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The lock's settings: every field may be left out. `tkn mutex freeze` sets `frozen`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tekton-mutex.dev",
    version = "v1alpha1",
    kind = "Mutex",
    plural = "mutexes",
    namespaced,
    status = "MutexStatus",
    shortname = "mtx",
    category = "tekton",
    category = "tekton-pipelines",
    printcolumn = r#"{"name":"Key","type":"string","jsonPath":".spec.key"}"#,
    printcolumn = r#"{"name":"Holders","type":"string","jsonPath":".status.holding"}"#,
    printcolumn = r#"{"name":"Waiting","type":"integer","jsonPath":".status.waiting"}"#,
    printcolumn = r#"{"name":"Last-Token","type":"integer","jsonPath":".status.lastToken"}"#,
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".spec.capacity"}"#,
    printcolumn = r#"{"name":"Frozen","type":"boolean","jsonPath":".spec.frozen"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A lock over one key of one namespace: the runs of a Mutex task with that key hold \
           it in turn. Created on the key's first use, or applied ahead with its settings; its \
           status is the lock state, written by the controller only."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.keyFrom) || has(self.selector)",
    "message": "keyFrom reads the key of the PipelineRuns a selector takes: give spec.selector too"
}, {
    "rule": "!has(self.sequenceFrom) || has(self.selector)",
    "message": "sequenceFrom reads the sequence of the PipelineRuns a selector takes: give spec.selector too"
}]))]
pub struct MutexSpec {
    #[serde(flatten)]
    pub lock: LockSpec,
    /// The key as the runs wrote it, when it is not the object's name itself
    /// (see crates/core/src/key_name.rs). Runs with another key never use this Mutex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub key: Option<String>,
    /// A Mutex the controller created for a key (label
    /// `app.kubernetes.io/managed-by: tekton-mutex`) that stays idle this many
    /// days is deleted; its tokens continue from the ledger if the key comes back.
    /// Default 30; 0 keeps it. A Mutex a person or GitOps applied is never deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_delete_days: Option<u32>,
    /// The PipelineRuns of its namespace that it takes by itself, with no annotation:
    /// made Pending as they are created, and queued whole on this Mutex's key, or on the
    /// key `keyFrom` reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<crate::selector::RunSelector>,
    /// Read each selected PipelineRun's key from one of its params or labels: each key
    /// is then a lock of its own (its own Mutex, created on first use with this one's
    /// capacity, order and maxQueue), and this Mutex is only the rule that selects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_from: Option<crate::selector::ValueFrom>,
    /// Read each selected PipelineRun's sequence (an integer, higher = newer: a build
    /// number) from one of its params or labels, as the `sequence` param would give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_from: Option<crate::selector::ValueFrom>,
}

/// Days an idle Mutex the controller created is kept (`spec.idleDeleteDays`).
pub const DEFAULT_IDLE_DELETE_DAYS: u32 = 30;

// The lock settings a Mutex and a ClusterMutex share (flattened into each
// spec): what the decision core reads. (A plain comment: a doc comment would
// become the description of every spec it is flattened into.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LockSpec {
    /// How many PipelineRuns may hold the slot at once (1 to 10000).
    #[serde(default = "default_capacity")]
    #[schemars(range(min = 1, max = MAX_CAPACITY))]
    pub capacity: u32,
    /// Which waiter goes first among equal priorities.
    #[serde(default)]
    pub order: Order,
    /// How many runs may wait at once; one more fails with reason `QueueFull`.
    #[serde(default = "default_max_queue")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_queue: u32,
    /// Days after its last grant that a group's supersede mark is forgotten:
    /// a run of that group older than the mark is then no longer stale.
    #[serde(default = "default_mark_idle_days")]
    #[schemars(range(min = 1, max = 3650))]
    pub mark_idle_days: u32,
    /// A frozen key grants nothing new: holders keep the slot, waiters stay
    /// queued (reason `Frozen`) and their timeouts still apply.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub frozen: bool,
    /// Why it is frozen: shown in every waiter's message (at most 1024 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub frozen_reason: Option<String>,
    /// Scheduled windows: `deny` windows grant nothing new while open, and with `allow`
    /// windows nothing new is granted outside them. Holders keep the key through any window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<crate::window::Window>,
    /// An operator's override of the windows, with an end and a reason
    /// (`tkn mutex override-window`): until it ends, a closed window grants as an open one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_override: Option<crate::window::WindowOverride>,
}

impl Default for LockSpec {
    fn default() -> Self {
        LockSpec {
            capacity: default_capacity(),
            order: Order::default(),
            max_queue: default_max_queue(),
            mark_idle_days: default_mark_idle_days(),
            frozen: false,
            frozen_reason: None,
            windows: Vec::new(),
            window_override: None,
        }
    }
}

impl Order {
    /// As written in a spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Order::OldestFirst => "oldest-first",
            Order::NewestFirst => "newest-first",
        }
    }
}

/// The largest capacity the CRD schema (and an embedded spec) accepts.
pub const MAX_CAPACITY: u32 = 10_000;

/// The largest fencing token a lock hands out or believes: 2^53 - 1, the largest integer
/// every JSON reader keeps exact, and far below i64's maximum, so a token written by hand
/// (a ledger entry, a run's result) can never push a key to the end of its tokens. A value
/// above it is refused, never persisted.
pub const MAX_TOKEN: i64 = (1 << 53) - 1;

/// Tokens the token ledger reserves at once. Each token must be in the ledger before a status
/// hands it out (a wiped or restored status, a deleted lock, must never hand one out again);
/// reserving a block, as a database sequence caches values, makes that one ledger write per
/// block instead of one per grant. Tokens follow the clock in milliseconds ([`next_token`]),
/// so a block is ten minutes of them: a key that grants often writes its ledger once every ten
/// minutes at most. A floor read after a wipe is the block's end: the tokens skip the rest of
/// the block (up to ten minutes ahead of the clock), and a gap is harmless where a repeat is
/// not.
pub const TOKEN_BLOCK: i64 = 10 * 60 * 1000;

/// What the ledger must hold before a status whose `lastToken` is `last` is written, when it
/// holds `covered` already: None if that covers it, else the end of a new block.
pub fn ledger_reserve(covered: i64, last: i64) -> Option<i64> {
    (last > covered).then(|| last.saturating_add(TOKEN_BLOCK - 1).min(MAX_TOKEN))
}

/// The next token after `last`, given the clock's floor (milliseconds since 1970 at the grant,
/// [`clock_floor`]): the larger of `last + 1` and the floor, so that tokens follow the clock
/// and stay above every token handed out before an etcd restore rolled `lastToken` and the
/// ledger back (a hybrid logical clock's rule). None once the key reached [`MAX_TOKEN`].
pub fn next_token(last: i64, clock_floor: i64) -> Option<i64> {
    last.checked_add(1)
        .map(|t| t.max(clock_floor))
        .filter(|t| *t <= MAX_TOKEN)
}

/// The clock's floor for a token granted at `now`: its milliseconds since 1970, within
/// 0..=[`MAX_TOKEN`] (2^53 milliseconds last some 285,000 years).
pub fn clock_floor(now: jiff::Timestamp) -> i64 {
    now.as_millisecond().clamp(0, MAX_TOKEN)
}

/// Is `token` one a lock could have handed out (1 to [`MAX_TOKEN`])?
pub fn token_in_range(token: i64) -> bool {
    (1..=MAX_TOKEN).contains(&token)
}

fn default_capacity() -> u32 {
    1
}

fn default_max_queue() -> u32 {
    1000
}

fn default_mark_idle_days() -> u32 {
    7
}

/// The supersede marks a status keeps at most: the groups granted most recently.
pub const MAX_GROUP_MARKS: usize = 256;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    #[default]
    OldestFirst,
    NewestFirst,
}

/// The lock state, written by the controller only, each change a compare-and-swap: who
/// holds the slot, who waits, and the last fencing token handed out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MutexStatus {
    /// Runs holding the slot, in grant order.
    #[serde(default)]
    pub holders: Vec<Holder>,
    /// Runs waiting, in the order they will be granted.
    #[serde(default)]
    pub queue: Vec<Waiter>,
    /// The last fencing token handed out. The next grant gets lastToken + 1, or the grant's
    /// time in milliseconds since 1970 if that is higher.
    /// The API server refuses a status that lowers it.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= oldSelf",
        "message": "lastToken never goes down: fencing tokens must keep increasing"
    }]))]
    #[schemars(range(min = 0, max = MAX_TOKEN))]
    pub last_token: i64,
    /// The newest run each group has been granted with a supersede policy other
    /// than `none`: later arrivals older than it are stale.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupMark>,
    /// Marks a person dropped (`tkn mutex forget`), kept while a run that made
    /// one still shows its grant: rebuilding the state never makes them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgotten_marks: Vec<GroupMark>,
    /// Holder PipelineRuns, comma-separated (for `kubectl get`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub holding: String,
    /// Queue length (for `kubectl get`).
    #[serde(default)]
    pub waiting: i64,
    /// spec.frozen as the controller last acted on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub frozen: bool,
    /// The scheduled window that keeps the lock from granting anything new, and until when
    /// ("deny window weekend-freeze until Mon 08:00 Europe/Berlin"), as last decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by_window: Option<String>,
    /// A window that would keep the lock from granting, overridden by an operator, until when
    /// and why, as last decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_override: Option<String>,
    /// Queue-control requests acted on, the most recent last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_requests: Vec<crate::requests::ObservedRequest>,
    /// PipelineRuns let go by a person, while anything of them can still run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dismissed: Vec<crate::requests::Dismissed>,
    /// Waiters moved to the front by a person (run uids), the latest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub promoted: Vec<String>,
    /// Slots kept for runs that take several keys, until every one of their keys
    /// keeps one (see `decide::multi_key`). Each takes a slot like a holder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// The uid of the lock object whose `lastToken` took in the token ledger's floor. A status
    /// that names another uid was restored from an earlier object of the name (a backup), so
    /// the ledger is read again before anything is granted: a restore never lowers the tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_read_for: Option<String>,
    /// The highest token the token ledger already holds for this lock object: tokens are
    /// reserved there in blocks ([`TOKEN_BLOCK`]), and one up to this is handed out without
    /// writing the ledger. Believed only while `ledgerReadFor` names this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_TOKEN))]
    pub ledger_covers: Option<i64>,
    /// The `Ready` condition: whether the controller serves this lock as its spec says
    /// (`kubectl wait --for=condition=Ready`), and if not, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A condition of the lock object, shaped as Kubernetes' own (`metav1.Condition`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's name: `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One word for why, in CamelCase: `Serving`, `Frozen`, `TokensExhausted`,
    /// `TokenLedgerFailed`.
    pub reason: String,
    /// What it means, and what to do about it.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: Timestamp,
    /// The object's `metadata.generation` this condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A slot this key keeps for a run of several keys: an idle hold, granted to
/// nobody, that becomes the run's hold once all its keys keep one in the same epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The run, as it waited in the queue.
    pub waiter: Waiter,
    /// The run's reservation epoch when the slot was kept: a slot of an older
    /// epoch than the run's is void.
    pub epoch: i64,
    /// The token this key gives the run if it is granted in this epoch.
    pub token: i64,
}

/// Which CustomRun (or Run) an entry stands for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    /// CustomRun, Run, or PipelineRun for a PipelineRun queued as a whole.
    pub kind: RunKind,
    /// The run's name (`namespace/name` in a ClusterMutex's status).
    pub name: String,
    /// The run's uid: a run re-created under the same name is another run.
    pub uid: String,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum RunKind {
    /// `tekton.dev/v1beta1` CustomRun.
    CustomRun,
    /// `tekton.dev/v1alpha1` Run.
    Run,
    /// `tekton.dev/v1` PipelineRun, queued as a whole before it starts (by annotations).
    PipelineRun,
}

impl RunKind {
    /// The Tekton API version of objects of this kind.
    pub fn api_version(self) -> &'static str {
        match self {
            RunKind::CustomRun => "tekton.dev/v1beta1",
            RunKind::Run => "tekton.dev/v1alpha1",
            RunKind::PipelineRun => "tekton.dev/v1",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::CustomRun => "CustomRun",
            RunKind::Run => "Run",
            RunKind::PipelineRun => "PipelineRun",
        }
    }
}

/// How old a run is. Higher is newer: by `sequence` when given, then by the
/// PipelineRun's creation time, with its name breaking ties.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Age {
    /// The run's `sequence` parameter (a build number), if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<i64>,
    /// The PipelineRun's creation time (the run's own for a standalone run).
    pub created: Timestamp,
    /// The PipelineRun's name (the run's own name for a standalone run).
    pub name: String,
}

/// The run's `supersede` parameter: `pending` (a newer run of the group cancels older
/// waiters), `running` (holders too) or `none`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Supersede {
    None,
    #[default]
    Pending,
    Running,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub run: RunRef,
    /// The PipelineRun holding the slot; absent for a standalone run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    /// That PipelineRun's uid: the hold outlives a deleted lock run, not a
    /// replaced PipelineRun of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_uid: Option<String>,
    /// The fencing token of this grant: higher than every earlier grant's of the key.
    pub token: i64,
    /// When the slot was granted.
    pub since: Timestamp,
    /// How long the run waited for the slot, in seconds.
    pub waited_seconds: i64,
    /// The run's supersede group (its `group` parameter, by default the Pipeline's name).
    pub group: String,
    pub age: Age,
    pub supersede: Supersede,
}

impl Holder {
    /// The entry as it waited (a hold keeps no priority: it no longer ranks).
    pub fn as_waiter(&self) -> Waiter {
        Waiter {
            run: self.run.clone(),
            pipeline_run: self.pipeline_run.clone(),
            pipeline_run_uid: self.pipeline_run_uid.clone(),
            group: self.group.clone(),
            age: self.age.clone(),
            priority: 0,
            supersede: self.supersede,
            waiting_since: None,
        }
    }
}

/// Which PipelineRun a status entry stands for: its name and uid (None for a
/// standalone run; the uid is None too in entries written before uids were kept).
pub type Party<'e> = (&'e Option<String>, &'e Option<String>);

impl Waiter {
    pub fn party(&self) -> Party<'_> {
        (&self.pipeline_run, &self.pipeline_run_uid)
    }
}

impl Holder {
    pub fn party(&self) -> Party<'_> {
        (&self.pipeline_run, &self.pipeline_run_uid)
    }
}

/// A waiting run, as the decision core reads it. Stored as [`StoredWaiter`]: the name its age
/// orders by is not written when it is the PipelineRun's (or, standalone, the run's) own.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", from = "StoredWaiter", into = "StoredWaiter")]
pub struct Waiter {
    pub run: RunRef,
    /// The PipelineRun waiting; absent for a standalone run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    /// That PipelineRun's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_uid: Option<String>,
    /// The run's supersede group (its `group` parameter, by default the Pipeline's name).
    pub group: String,
    pub age: Age,
    /// The run's `priority` parameter: higher goes first.
    #[serde(default)]
    pub priority: i64,
    pub supersede: Supersede,
    /// When the run started waiting (its first attempt's start, else its creation): for the
    /// oldest-waiter gauge and `tkn mutex describe`. It decides nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Timestamp>,
}

/// A waiting run, as the status stores it. Its age's name is left out when the waiter names
/// it already (its PipelineRun's, or a standalone run's own), so that a long queue's entries
/// stay small (issue 49); a status written with it reads the same.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredWaiter {
    pub run: RunRef,
    /// The PipelineRun waiting; absent for a standalone run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    /// That PipelineRun's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_uid: Option<String>,
    /// The run's supersede group (its `group` parameter, by default the Pipeline's name).
    pub group: String,
    pub age: StoredAge,
    /// The run's `priority` parameter: higher goes first.
    #[serde(default)]
    pub priority: i64,
    pub supersede: Supersede,
    /// When the run started waiting (its first attempt's start, else its creation): for the
    /// oldest-waiter gauge and `tkn mutex describe`. It decides nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<Timestamp>,
}

/// How old a run is. Higher is newer: by `sequence` when given, then by the PipelineRun's
/// creation time, with its name breaking ties (left to the waiter that stores it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredAge {
    /// The run's `sequence` parameter (a build number), if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<i64>,
    /// The PipelineRun's creation time (the run's own for a standalone run).
    pub created: Timestamp,
    /// The PipelineRun's name (the run's own name for a standalone run), when it is not the
    /// waiter's `pipelineRun` (or, standalone, its run's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The name a stored waiter's age goes by when it names none.
fn implied_age_name(run: &RunRef, pipeline_run: &Option<String>) -> String {
    pipeline_run.clone().unwrap_or_else(|| run.name.clone())
}

impl From<StoredWaiter> for Waiter {
    fn from(w: StoredWaiter) -> Self {
        let name = w
            .age
            .name
            .unwrap_or_else(|| implied_age_name(&w.run, &w.pipeline_run));
        Waiter {
            age: Age {
                sequence: w.age.sequence,
                created: w.age.created,
                name,
            },
            run: w.run,
            pipeline_run: w.pipeline_run,
            pipeline_run_uid: w.pipeline_run_uid,
            group: w.group,
            priority: w.priority,
            supersede: w.supersede,
            waiting_since: w.waiting_since,
        }
    }
}

impl From<Waiter> for StoredWaiter {
    fn from(w: Waiter) -> Self {
        let implied = w.age.name == implied_age_name(&w.run, &w.pipeline_run);
        StoredWaiter {
            age: StoredAge {
                sequence: w.age.sequence,
                created: w.age.created,
                name: (!implied).then_some(w.age.name),
            },
            run: w.run,
            pipeline_run: w.pipeline_run,
            pipeline_run_uid: w.pipeline_run_uid,
            group: w.group,
            priority: w.priority,
            supersede: w.supersede,
            waiting_since: w.waiting_since,
        }
    }
}

/// The schema is the stored form's: the CRD accepts what is written.
impl JsonSchema for Waiter {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        StoredWaiter::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        StoredWaiter::json_schema(generator)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupMark {
    /// The supersede group.
    pub group: String,
    /// The newest run the group was granted so far.
    pub newest: Age,
    /// That run's PipelineRun; absent for a standalone run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    /// That PipelineRun's uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run_uid: Option<String>,
    /// When the group was last granted: idle marks are forgotten, and only the
    /// most recently active groups are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<Timestamp>,
}

#[cfg(test)]
mod token_block_tests {
    use super::*;

    #[test]
    fn a_token_the_ledger_covers_needs_no_write_and_one_above_reserves_a_block() {
        assert_eq!(ledger_reserve(64, 10), None);
        assert_eq!(ledger_reserve(64, 64), None);
        assert_eq!(ledger_reserve(64, 65), Some(65 + TOKEN_BLOCK - 1));
        assert_eq!(ledger_reserve(0, 1), Some(TOKEN_BLOCK));
        assert_eq!(ledger_reserve(0, MAX_TOKEN), Some(MAX_TOKEN));
        assert_eq!(
            ledger_reserve(MAX_TOKEN - 3, MAX_TOKEN - 1),
            Some(MAX_TOKEN)
        );
    }

    #[test]
    fn tokens_follow_the_clock_and_never_go_back_with_it() {
        let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let floor = clock_floor(now);
        assert_eq!(floor, 1_800_000_000_000);
        assert_eq!(
            next_token(3, floor),
            Some(floor),
            "a small lastToken jumps to the clock"
        );
        // A clock behind the last token (a restore's rollback of the clock, a skewed leader):
        // the counter goes on.
        assert_eq!(next_token(floor + 5, floor), Some(floor + 6));
        assert_eq!(next_token(MAX_TOKEN, floor), None);
        assert_eq!(next_token(1, MAX_TOKEN + 1), None);
        let before_1970 = jiff::Timestamp::from_second(-5).unwrap();
        assert_eq!(next_token(0, clock_floor(before_1970)), Some(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Issue 49: a waiter's entry does not repeat its PipelineRun's name in its age; one
    /// written before (with it) reads the same, and one whose age goes by another name keeps it.
    #[test]
    fn a_waiter_is_stored_without_repeating_its_name() {
        let old = json!({
            "run": {"kind": "CustomRun", "name": "deploy-1-lock", "uid": "u1"},
            "pipelineRun": "deploy-1", "pipelineRunUid": "p1", "group": "deploy",
            "age": {"created": "2026-11-30T23:59:00Z", "name": "deploy-1"},
            "supersede": "pending",
        });
        let w: Waiter = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(w.age.name, "deploy-1");
        let stored = serde_json::to_value(&w).unwrap();
        assert_eq!(stored["age"], json!({"created": "2026-11-30T23:59:00Z"}));
        assert_eq!(serde_json::from_value::<Waiter>(stored).unwrap(), w);
        let standalone = json!({
            "run": {"kind": "CustomRun", "name": "s1", "uid": "u2"}, "group": "s1",
            "age": {"created": "2026-11-30T23:59:00Z"}, "supersede": "none",
        });
        let w: Waiter = serde_json::from_value(standalone).unwrap();
        assert_eq!(w.age.name, "s1", "a standalone run's own name");
        let mut other = serde_json::from_value::<Waiter>(old).unwrap();
        other.age.name = "elsewhere".into();
        let stored = serde_json::to_value(&other).unwrap();
        assert_eq!(stored["age"]["name"], "elsewhere");
    }

    /// A status written before the switch of time library reads the same and is
    /// written back the same: RFC 3339 in UTC, with or without a fraction.
    #[test]
    fn an_old_status_round_trips_with_its_times() {
        let age = json!({"created": "2026-11-30T23:59:00Z", "name": "deploy-1"});
        let old = json!({
            "holders": [{
                "run": {"kind": "CustomRun", "name": "deploy-1-lock", "uid": "u1"},
                "token": 3,
                "since": "2026-12-01T00:00:00.123456789Z",
                "waitedSeconds": 60,
                "group": "deploy",
                "age": age,
                "supersede": "none",
            }],
            "queue": [],
            "lastToken": 3,
            "groups": [{"group": "deploy", "newest": age, "granted": "2026-12-01T00:00:00Z"}],
            "waiting": 0,
        });
        let status: MutexStatus = serde_json::from_value(old.clone()).unwrap();
        let since = status.holders[0].since;
        assert_eq!(
            (since.as_second(), since.subsec_nanosecond()),
            (1_796_083_200, 123_456_789)
        );
        assert_eq!(
            status.groups[0].granted,
            Some(Timestamp::from_second(1_796_083_200).unwrap())
        );
        assert_eq!(serde_json::to_value(&status).unwrap(), old);
    }
}
