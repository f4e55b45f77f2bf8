#!/bin/bash
cd /work/main
K=.cache/guest/kernel/vmlinux; I=.cache/guest/initramfs.cpio.gz; SHAPE="package:2 [numa] die:3 l3:1 l2:1 core:2 pu:1"
timeout 300 target/release/vmm -vv run --kernel $K --initrd $I --memory 768M --guest "$SHAPE" --sched ${S:-vcpu_sched} --cmdline "loglevel=8 sched_verbose" --until "root domain span" --timeout 20m > /tmp/boot/$1.console 2> /tmp/boot/$1.err
echo "$1 $(grep -o 'matched after [0-9.]* s: \[ *[0-9.]*\]' /tmp/boot/$1.err) $(grep -o 'kicked.*' /tmp/boot/$1.err | cut -c1-100)"
for p in "Bringing up" "Brought up" "root domain"; do grep -m1 "$p" /tmp/boot/$1.console | cut -c1-14; done | tr '\n' ' '; echo
