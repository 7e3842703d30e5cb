// Host memory on transparent huge pages (2 MiB), for the big arrays the kernels stream: packed
// weights and the KV pool. With 4 KiB pages a decode token at 4k context touches ~23k pages of
// KV (SmolLM2: 16-position blocks of every layer, 368 KiB apart), far more than the TLB holds,
// so each block's rows waited on a page walk; 2 MiB pages cut that to ~50.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem {

// `bytes` rounded up to 2 MiB, 2 MiB aligned, marked for huge pages (a hint: where the kernel
// says no, 4 KiB pages). zero: written with zeros now (committing it); otherwise the pages
// are committed as they are first touched, zero-filled by the kernel.
std::shared_ptr<uint8_t[]> allocate_huge_pages(size_t bytes, bool zero);

}  // namespace tandem
