;; A per-flow packet counter for a tenant (picnic offload program, see docs/switch.md
;; "Offload programs"): each IPv4 flow delivered to the tenant's VMs (source and destination
;; address, protocol, and ports for TCP and UDP) gets the next counter slot, 0 to 62, in the
;; order flows appear; slot 63 counts the frames of later flows and of non-IPv4 frames.
;; The flows' keys are kept in the program's own memory (16 bytes each from offset 1024).
(module
  (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
  (import "picnic" "count" (func $count (param i32 i64)))
  (memory (export "memory") 1)
  (global $flows (mut i32) (i32.const 0))

  (func (export "ingress") (param $len i32) (result i32)
    (local $n i32) (local $proto i32) (local $l4 i32) (local $k1 i64) (local $k2 i64)
    (local $i i32) (local $entry i32)
    (local.set $n (select (local.get $len) (i32.const 80)
                          (i32.lt_u (local.get $len) (i32.const 80))))
    (drop (call $load (i32.const 0) (i32.const 0) (local.get $n)))
    (if (i32.or (i32.lt_u (local.get $n) (i32.const 34))
                (i32.ne (i32.or (i32.shl (i32.load8_u (i32.const 12)) (i32.const 8))
                                (i32.load8_u (i32.const 13)))
                        (i32.const 0x0800)))
      (then (call $count (i32.const 63) (i64.const 1)) (return (i32.const 0))))
    ;; The key: both addresses (8 bytes at 26), then the protocol and both ports.
    (local.set $k1 (i64.load (i32.const 26)))
    (local.set $proto (i32.load8_u (i32.const 23)))
    (local.set $l4 (i32.add (i32.const 14)
                            (i32.shl (i32.and (i32.load8_u (i32.const 14)) (i32.const 15))
                                     (i32.const 2))))
    (local.set $k2 (i64.extend_i32_u (local.get $proto)))
    (if (i32.and (i32.or (i32.eq (local.get $proto) (i32.const 6))
                         (i32.eq (local.get $proto) (i32.const 17)))
                 (i32.le_u (i32.add (local.get $l4) (i32.const 4)) (local.get $n)))
      (then (local.set $k2 (i64.or (local.get $k2)
                                   (i64.shl (i64.extend_i32_u (i32.load (local.get $l4)))
                                            (i64.const 8))))))
    ;; A known flow: count it in its slot.
    (block $new
      (loop $scan
        (br_if $new (i32.ge_u (local.get $i) (global.get $flows)))
        (local.set $entry (i32.add (i32.const 1024) (i32.shl (local.get $i) (i32.const 4))))
        (if (i32.and (i64.eq (i64.load (local.get $entry)) (local.get $k1))
                     (i64.eq (i64.load offset=8 (local.get $entry)) (local.get $k2)))
          (then (call $count (local.get $i) (i64.const 1)) (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))
    ;; A new flow: the next slot while there is one, else the overflow slot.
    (if (i32.lt_u (global.get $flows) (i32.const 63))
      (then
        (local.set $entry (i32.add (i32.const 1024) (i32.shl (global.get $flows) (i32.const 4))))
        (i64.store (local.get $entry) (local.get $k1))
        (i64.store offset=8 (local.get $entry) (local.get $k2))
        (call $count (global.get $flows) (i64.const 1))
        (global.set $flows (i32.add (global.get $flows) (i32.const 1))))
      (else (call $count (i32.const 63) (i64.const 1))))
    (i32.const 0)))
