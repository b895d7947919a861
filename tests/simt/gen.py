#!/usr/bin/env python3
"""Turns CUDA kernel sources into host C++ for the SIMT emulator (emu.h).

usage: gen.py SRC_DIR OUT_DIR NAME.cu...             (kernels only, for tests/simt)
       gen.py --launchers SRC_DIR OUT_DIR NAME.cu... (kernels and launchers, for tests/cuda_host)

For each NAME.cu (and every kernels/cuda/*.cuh it includes, recursively) it
writes OUT_DIR/gen_NAME.h with:
  - `#include "emu.h"` first (it redefines __global__, __shared__, threadIdx...);
  - `#include "kernels/cuda/X.cuh"` -> `#include "gen_X.h"`;
  - `__shared__ [__align__(N)] T a[n][m]..., b[k];` -> emulator shared memory,
    one slot per declaration; `extern __shared__ ... T a[];` -> dynamic smem;
  - the inline PTX of flash_attention_common.cuh (mma.sync, ldmatrix, cp.async)
    and wgmma.cuh (wgmma, its fences, commits and waits)
    -> the emulator's ::emu::mma, ::emu::ldmatrix_x4, ::emu::cp_async,
    ::emu::wgmma...;
  - every top-level function that launches a kernel (`<<<`), or calls one
    that does, removed (the launchers; the drivers mirror their grids).
With --launchers it writes OUT_DIR/host_NAME.cpp instead, keeping the
launchers and rewriting each launch `k<<<grid, block, smem, stream>>>(args);`
into `::hostcuda::launch_kernel(k, "k", __FILE__, __LINE__,
::hostcuda::launch_config(grid, block, smem, stream), args);`
(tests/cuda_host/shim/launch.h): the launch's own grid and block, enqueued on
its stream by the host CUDA shim.
It fails (exit 1) on anything it does not know how to translate (another asm
statement, a __shared__ form it does not parse), so a kernel change that the
emulator cannot follow breaks the build instead of being skipped silently.
"""
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    sys.stderr.write('gen.py: ' + msg + '\n')
    sys.exit(1)


def shared_decls(text, name):
    def dyn(m):
        return f'{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(::emu::dyn_smem());'
    text = re.sub(r'extern __shared__ (?:__align__\(\d+\) )?((?:unsigned )?[\w:]+) (\w+)\[\];', dyn, text)

    def stat(m):
        ty, decls = m.group(1), m.group(2)
        out = []
        for d in decls.split(','):
            dm = re.fullmatch(r'\s*(\w+)((?:\[[^\]]+\])+)\s*', d)
            if not dm:
                fail(f'{name}: cannot parse __shared__ declarator "{d}"')
            var, dims = dm.group(1), re.findall(r'\[([^\]]+)\]', dm.group(2))
            inner = ''.join(f'[{x}]' for x in dims[1:])
            elem = f'{ty}{inner}'
            ptr = f'{ty} (*{var}){inner}' if inner else f'{ty}* {var}'
            out.append(f'static char {var}_site_; '
                       f'{ptr} = ::emu::shared<{elem}>(&{var}_site_, {dims[0]});')
        return ' '.join(out)
    text = re.sub(r'(?<!extern )__shared__ (?:__align__\(\d+\) )?((?:unsigned )?[\w:]+) ([^;]+);', stat, text)
    if '__shared__' in text:
        fail(f'{name}: a __shared__ form the generator does not handle')
    return text


def closing_paren(text, i):
    # The index of the parenthesis that closes the one at text[i].
    depth = 0
    while True:
        if text[i] == '(':
            depth += 1
        elif text[i] == ')':
            depth -= 1
            if depth == 0:
                return i
        i += 1


# The inline PTX of ASM_FILES (one instruction per asm statement, inside a
# wrapper whose parameters and constants the call names) -> the emulator.
ASM_TO_EMU = {
    'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32': '::emu::mma(c, a, b0, b1);',
    'ldmatrix.sync.aligned.m8n8.x4.shared.b16': '::emu::ldmatrix_x4(r, p, false);',
    'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16': '::emu::ldmatrix_x4(r, p, true);',
    'cp.async.cg.shared.global':
        '::emu::cp_async_source_read(src, src_bytes); ::emu::cp_async(dst, src, src_bytes);',
    'cp.async.commit_group': '::emu::cp_async_commit();',
    'cp.async.wait_group': '::emu::cp_async_wait(N);',
    # wgmma.cuh
    'wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16': '::emu::wgmma(d, kN, a, b, ScaleD, kTransB);',
    'wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16': '::emu::wgmma(d, kN, a, b, ScaleD, kTransB);',
    'wgmma.fence.sync.aligned': '::emu::wgmma_fence();',
    'wgmma.commit_group.sync.aligned': '::emu::wgmma_commit();',
    'wgmma.wait_group.sync.aligned': '::emu::wgmma_wait(N);',
    'fence.proxy.async.shared': '::emu::fence_proxy_async();',
    '': '(void)r;',  # reg_fence: a compiler-only register fence
}
ASM_FILES = ('flash_attention_common.cuh', 'wgmma.cuh')


def replace_asm(text, name):
    out, pos = [], 0
    for m in re.finditer(r'\basm(?: volatile)?\(', text):
        if m.start() < pos:
            continue
        if name not in ASM_FILES:
            fail(f'{name}: inline asm the emulator does not know')
        e = closing_paren(text, m.end() - 1)  # the statement ends there
        if text[e + 1] != ';':
            fail(f'{name}: an asm statement not followed by ";"')
        stmt = text[m.start():e + 2]
        lit = re.search(r'"([^"]*)"', stmt)
        op = re.match(r'[\w.]*', lit.group(1)).group(0) if lit else ''
        if op not in ASM_TO_EMU:
            fail(f'{name}: inline asm "{op}" the emulator does not implement')
        # Same number of lines, so that #line keeps compiler messages on the source lines.
        out.append(text[pos:m.start()])
        out.append(ASM_TO_EMU[op] + '\n' * stmt.count('\n'))
        pos = e + 2
    out.append(text[pos:])
    return ''.join(out)


def cut_launchers(text, name):
    # Top-level functions (column 0, optional template line) up to the next
    # line starting with '}'. Removed: those with a launch (<<<) and, to a
    # fixed point, those calling a removed one. Everything else (kernels,
    # device and host helpers such as embedding_backward_plan) stays.
    funcs = []
    for m in re.finditer(r'^(?:template <[^\n]*>\n)?(?:static |inline )?[\w:]+ (\w+)\([^;{]*\)\s*\{', text, re.M):
        end = re.compile(r'^\}[^\n]*\n', re.M).search(text, m.end())
        funcs.append((m.start(), end.end() if end else len(text), m.group(1)))
    removed = set()
    changed = True
    while changed:
        changed = False
        for start, end, fname in funcs:
            body = text[start:end]
            if (start, fname) in removed:
                continue
            if '<<<' in body or any(re.search(r'\b' + re.escape(r) + r'\s*[<(]', body) for _, r in removed):
                removed.add((start, fname))
                changed = True
    out, pos = [], 0
    for start, end, fname in funcs:
        if (start, fname) in removed:
            out.append(text[pos:start])
            out.append('// (%s: host launcher, removed by tests/simt/gen.py)\n' % fname)
            # keep the line count
            out.append('\n' * (text[start:end].count('\n') - 1))
            pos = end
    out.append(text[pos:])
    return ''.join(out)


def split_top(text, sep=','):
    # Splits at `sep` outside parentheses, brackets and braces.
    parts, depth, cur = [], 0, ''
    for ch in text:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    parts.append(cur)
    return parts


def rewrite_launches(text, name):
    # `KERNEL<<<cfg>>>(args);` -> ::hostcuda::launch_kernel(...), keeping the
    # line count (and so the #line positions) of the source.
    out, pos = [], 0
    while True:
        i = text.find('<<<', pos)
        if i < 0:
            break
        km = re.search(r'([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*$', text[pos:i])
        if not km:
            fail(f'{name}: cannot find the kernel before a <<< launch')
        kstart = pos + km.start(1)
        kernel = km.group(1)
        j = text.find('>>>', i)
        if j < 0:
            fail(f'{name}: <<< without >>>')
        cfg = text[i + 3:j]
        k = j + 3
        while text[k] in ' \t\n':
            k += 1
        if text[k] != '(':
            fail(f'{name}: a launch of {kernel} without an argument list')
        e = closing_paren(text, k)
        args = text[k + 1:e]
        parts = [p.strip() for p in split_top(cfg)]
        if not 2 <= len(parts) <= 4:
            fail(f'{name}: launch of {kernel} with {len(parts)} configuration values')
        call = (f'::hostcuda::launch_kernel({kernel}, "{kernel}", __FILE__, __LINE__, '
                f'::hostcuda::launch_config({", ".join(p.replace(chr(10), " ") for p in parts)})')
        if args.strip():
            call += ', ' + args
        call += ')' + '\n' * (cfg.count('\n') + text[j:k].count('\n'))
        out.append(text[pos:kstart])
        out.append(call)
        pos = e + 1
    out.append(text[pos:])
    return ''.join(out)


def translate(src_dir, out_dir, name, done, launchers=False):
    if name in done:
        return
    done.add(name)
    path = os.path.join(src_dir, name)
    text = open(path).read()
    # #line names the file relative to the repository: __FILE__ (in the launch messages) then
    # does not carry the clone's location, which would make ccache miss in every fresh clone.
    line_path = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
    for inc in re.findall(r'#include "kernels/cuda/(\w+)\.cuh"', text):
        translate(src_dir, out_dir, inc + '.cuh', done)
    text = re.sub(r'#include "kernels/cuda/(\w+)\.cuh"', r'#include "gen_\1.h"', text)
    text = replace_asm(text, name)
    text = shared_decls(text, name)
    base = name.rsplit('.', 1)[0]
    if launchers and name.endswith('.cu'):
        text = rewrite_launches(text, name)
        out = ('// Generated by tests/simt/gen.py --launchers from src/kernels/cuda/' + name + ': do not edit.\n'
               '#include "emu.h"\n#include "launch.h"\n#line 1 "' + line_path + '"\n' + text)
        dst = os.path.join(out_dir, 'host_' + base + '.cpp')
    else:
        if name.endswith('.cu'):
            text = cut_launchers(text, name)
        out = ('// Generated by tests/simt/gen.py from src/kernels/cuda/' + name + ': do not edit.\n'
               '#pragma once\n#include "emu.h"\n#line 1 "' + line_path + '"\n' + text)
        dst = os.path.join(out_dir, 'gen_' + base + '.h')
    if '<<<' in text:
        fail(f'{name}: a kernel launch left after cutting or rewriting the launchers')
    if not os.path.exists(dst) or open(dst).read() != out:
        open(dst, 'w').write(out)


def main():
    argv = sys.argv[1:]
    launchers = bool(argv) and argv[0] == '--launchers'
    if launchers:
        argv = argv[1:]
    if len(argv) < 3:
        fail('usage: gen.py [--launchers] SRC_DIR OUT_DIR NAME.cu...')
    src_dir, out_dir = argv[0], argv[1]
    os.makedirs(out_dir, exist_ok=True)
    done = set()
    for name in argv[2:]:
        translate(src_dir, out_dir, name, done, launchers)


if __name__ == '__main__':
    main()
