#include "textflag.h"

// func skipQuietAVX2(b []byte) int
//
// Returns the length of the longest prefix of b, in whole 32-byte blocks, that holds no colon
// and no backslash.
TEXT ·skipQuietAVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	XORQ DX, DX
	MOVQ $0x3a, AX
	MOVQ AX, X1
	VPBROADCASTB X1, Y1
	MOVQ $0x5c, AX
	MOVQ AX, X2
	VPBROADCASTB X2, Y2

loop:
	MOVQ CX, AX
	SUBQ DX, AX
	CMPQ AX, $64
	JB   single
	VMOVDQU (SI)(DX*1), Y0
	VMOVDQU 32(SI)(DX*1), Y3
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPCMPEQB Y1, Y3, Y6
	VPCMPEQB Y2, Y3, Y7
	VPOR     Y5, Y4, Y4
	VPOR     Y7, Y6, Y6
	VPOR     Y6, Y4, Y6
	VPMOVMSKB Y6, AX
	TESTL AX, AX
	JNZ  first
	ADDQ $64, DX
	JMP  loop

first:
	// A hit in the pair of blocks: keep the first block when it has none.
	VPMOVMSKB Y4, AX
	TESTL AX, AX
	JNZ  done
	ADDQ $32, DX
	JMP  done

single:
	CMPQ AX, $32
	JB   done
	VMOVDQU (SI)(DX*1), Y0
	VPCMPEQB Y1, Y0, Y4
	VPCMPEQB Y2, Y0, Y5
	VPOR     Y5, Y4, Y4
	VPMOVMSKB Y4, AX
	TESTL AX, AX
	JNZ  done
	ADDQ $32, DX

done:
	VZEROUPPER
	MOVQ DX, ret+24(FP)
	RET
