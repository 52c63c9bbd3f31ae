/* The checks the C test programs print, one line each ("ok   ..." / "FAIL ..."); each
 * program declares `static int fails;` before including this and exits non-zero when it is
 * not 0. */
#ifndef FAKE_RDMA_TEST_CHECK_H
#define FAKE_RDMA_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>

#define CHECK(cond, ...)                                                                  \
	do {                                                                              \
		if (cond) {                                                               \
			printf("ok   " __VA_ARGS__);                                          \
		} else {                                                                  \
			printf("FAIL " __VA_ARGS__);                                          \
			fails++;                                                          \
		}                                                                         \
		printf("\n");                                                             \
	} while (0)

/* a call that returns NULL with errno `want` */
#define WANT_NULL(want, call)                                                             \
	do {                                                                              \
		void *p_;                                                                 \
		int e_;                                                                   \
		errno = 0;                                                                \
		p_ = (void *)(call);                                                      \
		e_ = errno;                                                               \
		CHECK(!p_ && e_ == (want), "%s -> %p errno %d (want NULL errno %d)", #call, \
		      p_, e_, (want));                                                    \
	} while (0)

/* a call that returns `want` */
#define WANT_RET(want, call)                                                              \
	do {                                                                              \
		int r_ = (call);                                                          \
		CHECK(r_ == (want), "%s -> %d (want %d)", #call, r_, (want));             \
	} while (0)

#endif
