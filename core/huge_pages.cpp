#include "core/huge_pages.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace tandem {

std::shared_ptr<uint8_t[]> allocate_huge_pages(size_t bytes, bool zero) {
  constexpr size_t kHuge = size_t(2) << 20;
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  auto* mem = static_cast<uint8_t*>(::operator new[](rounded, std::align_val_t(kHuge), std::nothrow));
  if (!mem) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(mem, rounded, MADV_HUGEPAGE);
#endif
  if (zero) std::memset(mem, 0, rounded);
  return std::shared_ptr<uint8_t[]>(mem, [](uint8_t* p) { ::operator delete[](p, std::align_val_t(kHuge)); });
}

}  // namespace tandem
