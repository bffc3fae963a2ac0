//! Binding lifetimes as a contract (issue 28). In Rust the order is a compile-time guarantee: a
//! [`Cache`] borrows its [`Context`] (so the context cannot be dropped, moved or closed while a
//! cache lives: the `compile_fail` examples on `Cache` pin that), a `Cache` is neither `Send`
//! nor `Sync`, and each handle is freed by exactly one `Drop`. These tests cover what the
//! compiler allows: contexts moved to and dropped on other threads, reference cycles (leaked by
//! `Rc`, never freed twice), caches dropped in any order among themselves, and process exit
//! with live handles (in a child process: `exit_child`).

use std::cell::RefCell;
use std::rc::Rc;

use kvarn::{Cache, CacheOptions, Config, Context};

const D: i32 = 64;

fn config() -> Config {
    Config::from_preset("k4v2_g64", D).unwrap()
}

fn filled_cache(ctx: &Context) -> Cache<'_> {
    let mut cache = Cache::new(
        ctx,
        &CacheOptions {
            max_tokens: 256,
            max_sequences: 2,
            ..CacheOptions::new(config(), 1, 1)
        },
    )
    .unwrap();
    cache.add_sequence(1).unwrap();
    let kv = vec![1.0f32; D as usize];
    cache.append(1, 0, &kv, &kv).unwrap();
    cache
}

#[test]
fn contexts_move_to_other_threads_and_drop_there() {
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let ctx = Context::cpu().unwrap();
            std::thread::spawn(move || {
                let cache = filled_cache(&ctx);
                assert_eq!(cache.stats().unwrap().tokens, 1);
                drop(cache);
                drop(ctx);
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn caches_drop_in_any_order_before_their_context() {
    let ctx = Context::cpu().unwrap();
    let a = filled_cache(&ctx);
    let b = filled_cache(&ctx);
    let c = filled_cache(&ctx);
    drop(b);
    drop(a);
    assert_eq!(c.stats().unwrap().tokens, 1);
    drop(c);
    ctx.num_threads().unwrap();
}

struct Node {
    _ctx: Context,
    next: RefCell<Option<Rc<Node>>>,
}

#[test]
fn reference_cycles_leak_but_never_free_twice() {
    // A cycle of two nodes owning contexts: Rc never drops it (a leak, no double free); a
    // broken cycle drops each context once.
    for broken in [false, true] {
        let a = Rc::new(Node {
            _ctx: Context::cpu().unwrap(),
            next: RefCell::new(None),
        });
        let b = Rc::new(Node {
            _ctx: Context::cpu().unwrap(),
            next: RefCell::new(Some(a.clone())),
        });
        *a.next.borrow_mut() = Some(b.clone());
        if broken {
            a.next.borrow_mut().take();
        }
    }
}

/// Run by `process_exit_with_live_handles_is_clean` in a child process (ignored otherwise).
#[test]
#[ignore]
fn exit_child() {
    if std::env::var_os("KVARN_LIFETIME_EXIT_CHILD").is_none() {
        return;
    }
    let ctx = Box::leak(Box::new(Context::cpu().unwrap()));
    let cache = filled_cache(ctx);
    std::mem::forget(cache);
    let busy = Context::cpu().unwrap();
    let worker = std::thread::spawn(move || loop {
        let x = vec![1.0f32; 64 * D as usize];
        busy.quantize(&config(), &x, &x).unwrap();
    });
    std::mem::forget(worker);
    println!("ok exit");
    std::process::exit(0);
}

#[test]
fn process_exit_with_live_handles_is_clean() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "exit_child", "--nocapture"])
        .env("KVARN_LIFETIME_EXIT_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?}\n{}", out.status, text);
    assert!(text.contains("ok exit"), "{}", text);
}
