;; An egress ACL for a tenant (picnic offload program, see docs/switch.md "Offload programs"):
;; drops IPv4 packets to TCP or UDP port 22 and to 198.18.99.0/24, passes everything else.
;; Counter slot 0 counts passed frames, slot 1 denied ones (GET /stats, tenants[].offload).
(module
  (import "picnic" "load" (func $load (param i32 i32 i32) (result i32)))
  (import "picnic" "count" (func $count (param i32 i64)))
  (memory (export "memory") 1)

  ;; A big-endian u16 at memory offset $at.
  (func $u16 (param $at i32) (result i32)
    (i32.or (i32.shl (i32.load8_u (local.get $at)) (i32.const 8))
            (i32.load8_u (i32.add (local.get $at) (i32.const 1)))))

  (func $deny (result i32)
    (call $count (i32.const 1) (i64.const 1))
    (i32.const 1))

  (func (export "egress") (param $len i32) (result i32)
    (local $n i32) (local $proto i32) (local $l4 i32)
    ;; The headers: at most the first 80 bytes, copied to memory offset 0.
    (local.set $n (select (local.get $len) (i32.const 80)
                          (i32.lt_u (local.get $len) (i32.const 80))))
    (drop (call $load (i32.const 0) (i32.const 0) (local.get $n)))
    (if (i32.and (i32.ge_u (local.get $n) (i32.const 34))
                 (i32.eq (call $u16 (i32.const 12)) (i32.const 0x0800)))
      (then
        ;; Destination 198.18.99.0/24 (bytes 30-32 of the frame).
        (if (i32.and (i32.eq (call $u16 (i32.const 30)) (i32.const 0xC612))
                     (i32.eq (i32.load8_u (i32.const 32)) (i32.const 99)))
          (then (return (call $deny))))
        (local.set $proto (i32.load8_u (i32.const 23)))
        (local.set $l4 (i32.add (i32.const 14)
                                (i32.shl (i32.and (i32.load8_u (i32.const 14)) (i32.const 15))
                                         (i32.const 2))))
        ;; TCP or UDP to port 22.
        (if (i32.and (i32.or (i32.eq (local.get $proto) (i32.const 6))
                             (i32.eq (local.get $proto) (i32.const 17)))
                     (i32.le_u (i32.add (local.get $l4) (i32.const 4)) (local.get $n)))
          (then
            (if (i32.eq (call $u16 (i32.add (local.get $l4) (i32.const 2))) (i32.const 22))
              (then (return (call $deny))))))))
    (call $count (i32.const 0) (i64.const 1))
    (i32.const 0)))
