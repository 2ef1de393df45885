#!/bin/sh
# Fails if any function of BINARY outside the kernel tiers' namespaces
# (::avx2::, ::avx512vnni::) contains an instruction above the x86-64
# baseline: VEX/EVEX encodings (mnemonics v*, ymm/zmm registers), BMI1/2,
# LZCNT, MOVBE, POPCNT, SSE3/SSSE3/SSE4 (the common ones). Such code would
# fault on a CPU the binary is meant to run on (engine/cpu_isa.h).
#   isa_baseline_check.sh OBJDUMP BINARY
objdump=$1
binary=$2
"$objdump" -d --no-show-raw-insn -C "$binary" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $0; next }
  /\t/ {
    split($0, p, "\t"); ins = p[2]; m = ins; sub(/ .*/, "", m);
    checked++;
    if (fn ~ /::(avx2|avx512vnni)::/) { tier++; next }
    if (m ~ /^v/ || ins ~ /%[yz]mm/ || ins ~ /%k[0-7]/ ||
        m ~ /^(shlx|shrx|sarx|rorx|andn|bextr|blsi|blsr|blsmsk|bzhi|pdep|pext|mulx|lzcnt|movbe|popcnt|crc32)$/ ||
        m ~ /^(lddqu|movddup|movshdup|movsldup|addsubp[sd]|haddp[sd]|hsubp[sd])$/ ||
        m ~ /^(pshufb|pmaddubsw|pmulhrsw|palignr|pabs[bwd]|psign[bwd]|phadd[wd]|phsub[wd])$/ ||
        m ~ /^(round[sp][sd]|ptest|pblendvb|blendv?p[sd]|pblendw|pmin[su][bdw]|pmax[su][bdw]|pmulld|pmuldq)$/ ||
        m ~ /^(pcmpeqq|pcmpgtq|packusdw|insertps|extractps|pinsr[bdq]|pextr[bdq]|dpp[sd]|mpsadbw|pmov[sz]x..|phminposuw)$/) {
      if (bad < 20) print "above baseline: " ins "   in " fn;
      bad++;
    }
  }
  END {
    if (checked == 0) { print "no instructions disassembled"; exit 1 }
    if (tier == 0) { print "no kernel-tier code found (namespace check broken?)"; exit 1 }
    printf "%d instructions, %d in kernel tiers, %d above the baseline elsewhere\n", checked, tier, bad;
    exit bad > 0
  }'
