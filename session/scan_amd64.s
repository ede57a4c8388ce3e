//go:build !purego

#include "textflag.h"

// Each constant is 32 bytes: one byte repeated, or a 16-byte table repeated
// for both 128-bit lanes of VPSHUFB.
#define BYTES32(name, q) \
	DATA name<>+0(SB)/8, q  \
	DATA name<>+8(SB)/8, q  \
	DATA name<>+16(SB)/8, q \
	DATA name<>+24(SB)/8, q \
	GLOBL name<>(SB), RODATA|NOPTR, $32

BYTES32(quotes, $0x2222222222222222)
BYTES32(bslashes, $0x5c5c5c5c5c5c5c5c)
BYTES32(ctlMax, $0x1f1f1f1f1f1f1f1f)
BYTES32(nibble, $0x0f0f0f0f0f0f0f0f)

// Nibble tables for the bytes that may follow a backslash but for 'u'
// ('"', '/', '\\', 'b', 'f', 'n', 'r', 't'): a byte is one of them when the
// entry of its high nibble and the entry of its low nibble share a bit.
DATA escHi<>+0(SB)/8, $0x0804020000010000
DATA escHi<>+8(SB)/8, $0x0000000000000000
DATA escHi<>+16(SB)/8, $0x0804020000010000
DATA escHi<>+24(SB)/8, $0x0000000000000000
GLOBL escHi<>(SB), RODATA|NOPTR, $32
DATA escLo<>+0(SB)/8, $0x00040008000d0000
DATA escLo<>+8(SB)/8, $0x0104000200000000
DATA escLo<>+16(SB)/8, $0x00040008000d0000
DATA escLo<>+24(SB)/8, $0x0104000200000000
GLOBL escLo<>(SB), RODATA|NOPTR, $32

// MASK64 sets r to the 64-bit mask of the byte flags lo (bytes 0-31) and hi
// (bytes 32-63), using DI.
#define MASK64(lo, hi, r) \
	VPMOVMSKB lo, r  \
	VPMOVMSKB hi, DI \
	SHLQ      $32, DI \
	ORQ       DI, r

// CLASSIFY sets R9, R10 and R11 to the quotes, backslashes and bytes below
// 0x20 of the 64 bytes at ptr, leaving the bytes in Y0 and Y1.
#define CLASSIFY(ptr) \
	VMOVDQU  (ptr), Y0     \
	VMOVDQU  32(ptr), Y1   \
	VPCMPEQB Y0, Y4, Y2    \
	VPCMPEQB Y1, Y4, Y3    \
	MASK64(Y2, Y3, R9)     \
	VPCMPEQB Y0, Y5, Y2    \
	VPCMPEQB Y1, Y5, Y3    \
	MASK64(Y2, Y3, R10)    \
	VPMINUB  Y0, Y6, Y2    \
	VPCMPEQB Y0, Y2, Y2    \
	VPMINUB  Y1, Y6, Y3    \
	VPCMPEQB Y1, Y3, Y3    \
	MASK64(Y2, Y3, R11)

// BAD32 sets the flags in dst of the bytes of src that may not follow a
// backslash (but for 'u'), using Y11.
#define BAD32(src, dst) \
	VPSRLW   $4, src, dst  \
	VPAND    dst, Y7, dst  \
	VPSHUFB  dst, Y8, dst  \
	VPAND    src, Y7, Y11  \
	VPSHUFB  Y11, Y9, Y11  \
	VPAND    dst, Y11, dst \
	VPCMPEQB dst, Y10, dst

// func scanWindows(b []byte, i int) (k int, m uint64, n int, esc bool)
//
// See scanStringSIMD. Registers: SI b, DX len(b), AX the window's start,
// R12 its length, R8 esc, R9-R11 its quotes, backslashes and control bytes,
// R13 its bytes that may not be escaped, BX, CX and DI scratch.
TEXT ·scanWindows(SB), NOSPLIT, $0-57
	MOVQ    b_base+0(FP), SI
	MOVQ    b_len+8(FP), DX
	MOVQ    i+24(FP), AX
	XORQ    R8, R8
	VMOVDQU quotes<>(SB), Y4
	VMOVDQU bslashes<>(SB), Y5
	VMOVDQU ctlMax<>(SB), Y6
	VMOVDQU nibble<>(SB), Y7
	VMOVDQU escHi<>(SB), Y8
	VMOVDQU escLo<>(SB), Y9
	VPXOR   Y10, Y10, Y10

loop:
	MOVQ DX, BX
	SUBQ AX, BX
	CMPQ BX, $64
	JLT  tail
	LEAQ (SI)(AX*1), BX
	CLASSIFY(BX)
	MOVQ $64, R12
	MOVQ R9, BX
	ORQ  R10, BX
	ORQ  R11, BX
	JNZ  escapes
	ADDQ $64, AX
	JMP  loop

tail:
	// Fewer than 64 bytes are left: classify the last 64 bytes of b and shift
	// the masks so that bit 0 is b[AX].
	TESTQ BX, BX
	JZ    unterminated
	MOVQ  BX, R12
	LEAQ  -64(SI)(DX*1), BX
	CLASSIFY(BX)
	MOVQ  $64, CX
	SUBQ  R12, CX
	SHRQ  CX, R9
	SHRQ  CX, R10
	SHRQ  CX, R11
	MOVQ  R9, BX
	ORQ   R10, BX
	ORQ   R11, BX
	JNZ   escapes
	MOVQ  DX, AX

unterminated:
	XORQ R9, R9
	JMP  done

escapes:
	// R13 = the escaped bytes of the window, and BX = 1 if the byte after the
	// window is escaped. In a run of backslashes every second one escapes the
	// next byte; simdjson's odd-run trick finds them without a loop: adding
	// the starts of the runs that begin on odd bits to the backslashes carries
	// through those runs, flipping their parity relative to the even bits.
	//   follows = bs << 1
	//   sum, carry = bs + (bs &^ (even | follows))
	//   escaped = (even ^ sum << 1) & follows
	XORQ  R13, R13
	TESTQ R10, R10
	JZ    stops
	MOVQ  R10, CX
	SHLQ  $1, CX              // follows
	MOVQ  $0x5555555555555555, DI
	MOVQ  DI, R13
	ORQ   CX, R13
	NOTQ  R13
	ANDQ  R10, R13            // the starts of runs on odd bits
	XORQ  BX, BX
	ADDQ  R10, R13
	SETCS BX                  // the carry out of a full window
	SHLQ  $1, R13
	XORQ  DI, R13
	ANDQ  CX, R13             // escaped
	MOVQ  R12, CX
	MOVQ  R13, DI
	SHRQ  CX, DI              // count 64 is 0: bit 0 is never escaped
	ANDQ  $1, DI
	ORQ   DI, BX              // a short window's last byte escapes b[len(b)]

	// Escaped bytes that a simple escape does not allow send the window to the walk.
	BAD32(Y0, Y2)
	BAD32(Y1, Y3)
	MASK64(Y2, Y3, CX)
	CMPQ  R12, $64
	JEQ   masked
	MOVQ  CX, DI
	MOVQ  $64, CX
	SUBQ  R12, CX
	SHRQ  CX, DI
	MOVQ  DI, CX

masked:
	ANDQ R13, CX              // escaped bytes that may not be

stops:
	// DI = the first unescaped quote or control byte and all bits below it.
	MOVQ  R13, DI
	NOTQ  DI
	ANDQ  R9, DI
	ORQ   R11, DI
	JZ    nostop
	LEAQ  -1(DI), BX
	XORQ  BX, DI              // up to the stop: its index is the highest bit
	TESTQ R10, R10
	JZ    clean
	TESTQ DI, CX
	JNZ   walk
	XORQ  BX, BX
	TESTQ DI, R10
	SETNE BX
	ORQ   BX, R8

clean:
	BSRQ DI, DI
	ADDQ DI, AX
	XORQ R9, R9
	JMP  done

nostop:
	TESTQ R10, R10
	JZ    next
	TESTQ CX, CX
	JNZ   walk
	TESTQ BX, BX
	JNZ   walk
	MOVQ  $1, R8

next:
	ADDQ R12, AX
	JMP  loop

walk:
	ORQ R10, R9
	ORQ R11, R9

done:
	// R9 is 0 but for a window to walk (and then R12 its length).
	MOVQ AX, k+32(FP)
	MOVQ R9, m+40(FP)
	MOVQ R12, n+48(FP)
	MOVB R8, esc+56(FP)
	VZEROUPPER
	RET
