//! The life of a task, top to bottom. Every adapter (task API, OpenAI, Ollama-style chat,
//! Kolosal, Hyperswarm) goes through the same steps:
//!
//! 1. [`admission`]: validate the request, count its prompt (tokenized once, off the async
//!    runtime), check context and budgets, and either refuse it with a typed error or create
//!    the [`task::Task`] and put it in the queue. [`deadline`] decides first, before any
//!    tokenizing, whether the task can answer within its client's time, and refuses with the
//!    wait that would fit.
//! 2. [`queue`]: the bounded two-class queue (interactive before batch); full means 429 with
//!    `Retry-After`, or the oldest batch task dropped, by policy.
//! 3. [`dispatcher`]: one loop, woken on every change, that takes queued tasks in order and
//!    asks placement for a slot; queue timeouts and deadlines end tasks that waited too long,
//!    and [`shed`] sends back at once those the line, re-played at the pace the running tasks
//!    show, would start too late.
//! 4. [`placement`]: the pool for a task (its pin, or the least loaded pool serving its
//!    model) and a slot lease from that pool's engine; a task whose pools cannot come back
//!    ends at once with a retriable error.
//! 5. [`runner`]: runs the placed task on its engine slot and turns engine events into task
//!    events, with cancel, drain deadline, wall-clock, idle and deadline checks; a task whose
//!    remote worker was lost goes back to the queue with what it already produced.
//! 6. [`subscription`]: how anyone follows a task's events (replay from any point, then
//!    live) and how a client that goes away cancels it (only the last subscriber, after the
//!    grace period); [`sse`] writes a subscription as `text/event-stream` with event ids.
//!
//! [`state`] is the lifecycle's state (pools, queue, tasks, sessions, records, config), which
//! every step reads; the composition root (`app_state.rs`) holds it beside the parts above
//! the lifecycle (remote workers, the models folder, the cluster, keys), and the lifecycle
//! reaches those only through [`ports`] and [`cluster_port`]: it names none of their types
//! (`tests/module_layers.rs`).
//! [`endings`] is how every task ends (complete, fail, cancel, requeue after a lost worker),
//! whoever ends it. [`tokenize`] templates and tokenizes prompts off the runtime, once per task.
//! [`task_store`] keeps tasks (and their records) for the artifact TTL; [`eta`] turns pool
//! measurements into the queue-time and on-time estimates admission and the stream report;
//! [`running`] indexes the tasks in slots, for those estimates. In a cluster, admission hands
//! tasks to the cluster through [`cluster_port`] (which `cluster/` implements: the lifecycle
//! never names the cluster's types) as a [`handoff`], and [`relayed_task`] builds a task
//! admitted on another replica, to run it or to follow it.

pub mod admission;
pub mod cluster_port;
pub mod deadline;
pub mod dispatcher;
pub mod embed_runner;
pub mod endings;
pub mod eta;
pub mod fair_share;
pub mod handoff;
pub mod in_flight;
pub mod placement;
pub mod ports;
pub mod queue;
pub mod quota;
pub mod relayed_task;
pub mod request_work;
pub mod runner;
pub mod running;
pub mod shed;
pub mod sse;
pub mod state;
pub mod subscription;
pub mod task;
pub mod task_store;
