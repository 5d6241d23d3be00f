//! The instrumentation macros.
//!
//! Grammar shared by [`zone!`](crate::zone), [`instant!`](crate::instant),
//! [`begin!`](crate::begin) and [`instant_on!`](crate::instant_on):
//!
//! ```text
//! NAME  := "name"                  a static name (interned once per sequence)
//!        | "category", "name"      with a category (filtered by the session's config)
//!        | name: EXPR              a name computed at run time (&str, String: interned too)
//!        | "category", name: EXPR
//! ITEM  := key = EXPR              an argument: integers, floats, bools, strings
//!        | "key" = EXPR            an argument whose name is not an identifier
//!        | flow: EXPR              a `Flow` passing through the event
//!        | terminating_flow: EXPR  a `Flow` ending at the event
//!        | callstack               the call stack (`TACHYON_CALLSTACK` frames, else 16)
//!        | callstack: CONST        the call stack, at most CONST frames (≤ 64)
//! EVENT := NAME (, ITEM)* ,?
//! ```
//!
//! `callstack` applies to zones and instants (`zone!`, `instant!`, `instant_on!`; messages take
//! `message!(callstack: N, ...)`); `begin!`
//! ignores it. See [`callstack`](crate::callstack).
//!
//! Argument expressions are evaluated only when the callsite is enabled.

/// A scoped zone on this thread: returns a [`ZoneGuard`](crate::ZoneGuard); the slice ends
/// when it drops.
///
/// ```
/// let _zone = tachyon::zone!("parse");
/// let _zone = tachyon::zone!("net", "send", bytes = 512, peer = "10.0.0.2");
/// let kind = "job";
/// let _zone = tachyon::zone!(name: format!("{kind} 7"), attempt = 2u8);
/// ```
#[macro_export]
macro_rules! zone {
    ($($event:tt)+) => { $crate::__tachyon_name!(zone () $($event)+) };
}

/// An instant event on this thread's track.
///
/// ```
/// tachyon::instant!("cache miss");
/// tachyon::instant!("gc", "collect", freed = 1 << 20);
/// ```
#[macro_export]
macro_rules! instant {
    ($($event:tt)+) => { $crate::__tachyon_name!(instant () $($event)+) };
}

/// An instant event on a [`Track`](crate::Track): `instant_on!(&track, EVENT)`.
#[macro_export]
macro_rules! instant_on {
    ($track:expr, $($event:tt)+) => { $crate::__tachyon_name!(instant_on ($track) $($event)+) };
}

/// Begins a slice on a [`Track`](crate::Track): `begin!(&track, EVENT)` returns a
/// [`TrackSlice`](crate::TrackSlice) that ends the slice when dropped, on any thread.
///
/// ```
/// let track = tachyon::Track::new_async("request 17");
/// let slice = tachyon::begin!(&track, "handle request", id = 17);
/// std::thread::spawn(move || slice.end()).join().unwrap();
/// ```
#[macro_export]
macro_rules! begin {
    ($track:expr, $($event:tt)+) => { $crate::__tachyon_name!(begin ($track) $($event)+) };
}

/// A sample on the process's counter track with this (static) name:
/// `counter!("name", value)` or `counter!("name", value, Unit::Bytes)`.
///
/// ```
/// tachyon::counter!("queue depth", 12);
/// tachyon::counter!("heap", 1.5e6, tachyon::Unit::Bytes);
/// ```
#[macro_export]
macro_rules! counter {
    ($name:literal, $value:expr $(,)?) => {
        $crate::counter!($name, $value, $crate::Unit::None)
    };
    ($name:literal, $value:expr, $unit:expr $(,)?) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::Callsite::new(
            $name,
            ::core::option::Option::None,
            ::core::file!(),
            ::core::line!(),
            ::core::module_path!(),
            &[],
            $crate::CallsiteKind::Counter($unit),
        );
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                $crate::__rt::counter(
                    &__TACHYON_CALLSITE,
                    en,
                    $crate::CounterValue::sample($value),
                );
            }
        }
    }};
}

/// Parses the name part of an event.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_name {
    ($kind:ident $track:tt $cat:literal, $name:literal $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track (::core::option::Option::Some($cat)) (lit $name) [] [] $($($rest)*)?)
    };
    ($kind:ident $track:tt $cat:literal, name: $name:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track (::core::option::Option::Some($cat)) (dynamic $name) [] [] $($($rest)*)?)
    };
    ($kind:ident $track:tt name: $name:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track (::core::option::Option::None) (dynamic $name) [] [] $($($rest)*)?)
    };
    ($kind:ident $track:tt $name:literal $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track (::core::option::Option::None) (lit $name) [] [] $($($rest)*)?)
    };
}

/// Collects the items: argument names for the callsite, and `(method, expr)` pairs the event
/// applies to its [`EventContext`](crate::EventContext).
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_items {
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*]) => {
        $crate::__tachyon_emit!($kind $track $cat $name [$($an),*] [$($op)*])
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] flow: $f:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an),*] [$($op)* (flow, $f)] $($($rest)*)?)
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] terminating_flow: $f:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an),*] [$($op)* (terminating_flow, $f)] $($($rest)*)?)
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] callstack: $d:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an),*] [$($op)* (callstack, $d)] $($($rest)*)?)
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] callstack $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an),*] [$($op)* (callstack, usize::MAX)] $($($rest)*)?)
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] $key:ident = $v:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an,)* ::core::stringify!($key)] [$($op)* (arg, &$v)] $($($rest)*)?)
    };
    (@$kind:ident $track:tt $cat:tt $name:tt [$($an:expr),*] [$($op:tt)*] $key:literal = $v:expr $(, $($rest:tt)*)?) => {
        $crate::__tachyon_items!(@$kind $track $cat $name [$($an,)* $key] [$($op)* (arg, &$v)] $($($rest)*)?)
    };
}

/// The static name of a callsite ("" when named at run time).
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_static_name {
    (lit $name:literal) => {
        $name
    };
    (dynamic $name:expr) => {
        ""
    };
}

/// The run-time name of an event, if it has one.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_dyn_name {
    (lit $name:literal) => {
        ::core::option::Option::None
    };
    (dynamic $name:expr) => {
        ::core::option::Option::Some($crate::__rt::dyn_name(&$name))
    };
}

/// Declares the callsite and emits the event of `$kind`.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_emit {
    // The hot forms: a static name and no items.
    (zone () $cat:tt (lit $name:literal) [] []) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat (lit $name) []);
        if $crate::COMPILED_IN {
            match __TACHYON_CALLSITE.check() {
                ::core::option::Option::Some(en) => $crate::__rt::zone_begin(&__TACHYON_CALLSITE, en),
                ::core::option::Option::None => $crate::ZoneGuard::disabled(),
            }
        } else {
            $crate::ZoneGuard::disabled()
        }
    }};
    (instant () $cat:tt (lit $name:literal) [] []) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat (lit $name) []);
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                $crate::__rt::instant(&__TACHYON_CALLSITE, en);
            }
        }
    }};
    (zone () $cat:tt $name:tt [$($an:expr),*] [$(($m:ident, $e:expr))*]) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat $name [$($an),*]);
        if $crate::COMPILED_IN {
            match __TACHYON_CALLSITE.check() {
                ::core::option::Option::Some(en) => {
                    const __TACHYON_DEPTH: usize = 0 $(+ $crate::__tachyon_depth!($m, $e))*;
                    if __TACHYON_DEPTH != 0 {
                        $crate::__rt::zone_begin_stack(
                            &__TACHYON_CALLSITE,
                            en,
                            __TACHYON_DEPTH,
                            $crate::__tachyon_dyn_name!$name,
                            |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                        )
                    } else {
                        $crate::__rt::zone_begin_with(
                            &__TACHYON_CALLSITE,
                            en,
                            $crate::__tachyon_dyn_name!$name,
                            |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                        )
                    }
                }
                ::core::option::Option::None => $crate::ZoneGuard::disabled(),
            }
        } else {
            $crate::ZoneGuard::disabled()
        }
    }};
    (instant () $cat:tt $name:tt [$($an:expr),*] [$(($m:ident, $e:expr))*]) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat $name [$($an),*]);
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                const __TACHYON_DEPTH: usize = 0 $(+ $crate::__tachyon_depth!($m, $e))*;
                if __TACHYON_DEPTH != 0 {
                    $crate::__rt::instant_stack(
                        &__TACHYON_CALLSITE,
                        en,
                        __TACHYON_DEPTH,
                        ::core::option::Option::None,
                        $crate::__tachyon_dyn_name!$name,
                        |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                    );
                } else {
                    $crate::__rt::instant_with(
                        &__TACHYON_CALLSITE,
                        en,
                        ::core::option::Option::None,
                        $crate::__tachyon_dyn_name!$name,
                        |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                    );
                }
            }
        }
    }};
    (instant_on ($track:expr) $cat:tt $name:tt [$($an:expr),*] [$(($m:ident, $e:expr))*]) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat $name [$($an),*]);
        if $crate::COMPILED_IN {
            if let ::core::option::Option::Some(en) = __TACHYON_CALLSITE.check() {
                let track: &$crate::Track = $track;
                const __TACHYON_DEPTH: usize = 0 $(+ $crate::__tachyon_depth!($m, $e))*;
                if __TACHYON_DEPTH != 0 {
                    $crate::__rt::instant_stack(
                        &__TACHYON_CALLSITE,
                        en,
                        __TACHYON_DEPTH,
                        ::core::option::Option::Some(track),
                        $crate::__tachyon_dyn_name!$name,
                        |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                    );
                } else {
                    $crate::__rt::instant_with(
                        &__TACHYON_CALLSITE,
                        en,
                        ::core::option::Option::Some(track),
                        $crate::__tachyon_dyn_name!$name,
                        |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                    );
                }
            }
        }
    }};
    (begin ($track:expr) $cat:tt $name:tt [$($an:expr),*] [$(($m:ident, $e:expr))*]) => {{
        static __TACHYON_CALLSITE: $crate::Callsite = $crate::__tachyon_callsite!($cat $name [$($an),*]);
        if $crate::COMPILED_IN {
            match __TACHYON_CALLSITE.check() {
                ::core::option::Option::Some(en) => {
                    let track: &$crate::Track = $track;
                    $crate::__rt::track_begin(
                        &__TACHYON_CALLSITE,
                        en,
                        track,
                        $crate::__tachyon_dyn_name!$name,
                        |__tachyon_cx: &mut $crate::EventContext<'_, '_>| { $( __tachyon_cx.$m($e); )* },
                    )
                }
                ::core::option::Option::None => $crate::TrackSlice::disabled(),
            }
        } else {
            $crate::TrackSlice::disabled()
        }
    }};
}

/// The stack depth an item asks for: a `callstack` item's, 0 for any other.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_depth {
    (callstack, $d:expr) => {
        $d
    };
    ($m:ident, $e:expr) => {
        0usize
    };
}

/// A callsite's static initializer.
#[doc(hidden)]
#[macro_export]
macro_rules! __tachyon_callsite {
    ($cat:tt $name:tt [$($an:expr),*]) => {
        $crate::Callsite::new(
            $crate::__tachyon_static_name!$name,
            $cat,
            ::core::file!(),
            ::core::line!(),
            ::core::module_path!(),
            &[$($an),*],
            $crate::CallsiteKind::Event,
        )
    };
}
